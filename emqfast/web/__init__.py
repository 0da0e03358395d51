"""The emqfast web dashboard: see and steer every queue from a browser.

    from emqfast.web import create_app
    app = create_app(emqfast.connect(), read_only=False, auth=None)   # a Starlette app

Needs the ``web`` extra (Starlette, Jinja2, uvicorn: ``pip install -e '.[web]'`` from a
checkout, or a built wheel with ``[web]``).
``emqfast dashboard`` serves it. Pages read through the facade; actions go through
:class:`emqfast.Queue` methods; nothing here writes a key itself."""
from emqfast.web.factory import create_app

__all__ = ["create_app"]
