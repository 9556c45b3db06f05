"""What the admin's preset add form posts for a valid preset (tests vary one field)."""

FORM = {
    "name": "org/tiny:q8_0",
    "aliases": '["tiny"]',
    "model_path": "/models/tiny.gguf",
    "enabled": "on",
    "args": '[["ctx-size", "4096"]]',
    "env": "[]",
    "stop_timeout": "15",
    "load_on_startup": "unknown",
    "pinned": "unknown",
    "ttl": "",
    "load_timeout": "",
    "memory_estimate": "",
    "server_bin": "",
}
