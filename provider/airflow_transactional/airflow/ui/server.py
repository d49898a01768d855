"""The FastAPI app the api-server mounts at :data:`~.app.PREFIX`: the views' routes (:mod:`.app`)
and the correction action's (:mod:`.correct`), behind one guard -- no NUL in a path or parameter,
and the security headers on every response."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from ...exceptions import UnknownTopology
from . import app as views
from . import correct


def create_app() -> FastAPI:
    app = FastAPI(title="Transactional", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def _guard(request: Request, call_next: Callable[[Request], Any]) -> Response:
        if views.has_nul(request):
            response: Response = PlainTextResponse("a DAG id, run id or parameter cannot hold a NUL byte", 400)
        else:
            response = await call_next(request)
        response.headers.update(views.SECURITY_HEADERS)
        return response

    @app.exception_handler(UnknownTopology)
    def _unknown(request: Request, exc: UnknownTopology) -> Response:
        return Response(str(exc), status_code=404)

    app.include_router(views.router)
    app.include_router(correct.router)
    return app
