"""The OpenAI error shape."""

from __future__ import annotations

from starlette.responses import JSONResponse


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        err_type: str | None = None,
        code: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type or ("invalid_request_error" if status < 500 else "server_error")
        self.code = self.status if code is None else code

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.code}}
        extra = dict(headers or {})
        if self.status in (429, 503):
            extra["Retry-After"] = "1"
        return JSONResponse(body, status_code=self.status, headers=extra or None)
