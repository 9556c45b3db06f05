# Issue 17.7: a key may ask for the queue position in its streams (SSE comment lines).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('models_app', '0013_reservations'),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='queue_comments',
            field=models.BooleanField(default=False, help_text='While a streamed chat waits for its model, send the queue position and the load\'s progress as SSE comment lines (OpenAI clients ignore them).', verbose_name='queue position in streams'),
        ),
    ]
