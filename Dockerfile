# RouterPanel's image for the team deployment (docker-compose.yml): web, router (Linux), Celery
# worker and beat all run it with different commands. It has no llama-server: the router
# service needs one added (see docker-compose.yml); the other services never start children.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    ROUTERPANEL_DATA_DIR=/data

WORKDIR /app
# Dependencies first, so that a code change does not reinstall them; every version, direct and
# transitive, is the one requirements.lock pins (the image leaves out the test tools).
COPY pyproject.toml README.md requirements.lock ./
RUN mkdir -p routerpanel models_app \
    && touch routerpanel/__init__.py models_app/__init__.py \
    && pip install --constraint requirements.lock . \
    && pip uninstall --yes routerpanel
COPY manage.py ./
COPY routerpanel ./routerpanel
COPY models_app ./models_app
COPY templates ./templates
COPY static ./static
# Editable: settings find templates/ and static/ next to the packages (BASE_DIR).
RUN pip install --no-deps -e . \
    && useradd --create-home --uid 1000 routerpanel \
    && mkdir -p /data \
    && chown routerpanel /data
USER routerpanel
VOLUME ["/data"]
EXPOSE 8080
CMD ["python", "manage.py", "serve", "--no-router", "--host", "0.0.0.0", "--port", "8080"]
