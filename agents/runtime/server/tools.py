"""A chat request's ``tools``, ``tool_choice`` and ``chat_template_kwargs``, checked: each tool a function with a
name and a JSON-schema ``parameters`` object, a bounded count and size, a choice among ``none``, ``auto``,
``required`` or a named function of the list; a 400 names the field at fault."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from agents.runtime.server.errors import APIError

MAX_TOOLS = 128
MAX_TOOLS_BYTES = 256 * 1024  # the tools' JSON together
MAX_TEMPLATE_KWARGS = 32
NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's rule for function names
RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


@dataclass
class ToolRequest:
    """``tools``: the OpenAI tool objects, as sent (what the template gets); ``schemas``: name -> function
    object; ``choice``: ``none``, ``auto``, ``required`` or a function's name; ``parallel``: parallel calls
    allowed (OpenAI's ``parallel_tool_calls``)."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    choice: str = "none"
    named: bool = False
    parallel: bool = True

    @property
    def parses(self) -> bool:
        return bool(self.tools) and self.choice != "none"


def tool_request(body: dict[str, Any]) -> ToolRequest:
    tools = body.get("tools")
    if body.get("functions") not in (None, []) or body.get("function_call") not in (None, "none"):
        raise APIError(400, "'functions' and 'function_call' are deprecated; send 'tools' and 'tool_choice'",
                       "functions" if body.get("functions") else "function_call")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise APIError(400, "'tools' must be a list of {\"type\": \"function\", \"function\": {...}}", "tools")
    if len(tools) > MAX_TOOLS:
        raise APIError(400, f"'tools' holds {len(tools)} tools; at most {MAX_TOOLS}", "tools")
    if len(json.dumps(tools)) > MAX_TOOLS_BYTES:
        raise APIError(400, f"'tools' is over {MAX_TOOLS_BYTES // 1024} KiB of JSON", "tools")
    schemas: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        function = _function(tool, f"tools[{i}]")
        if function["name"] in schemas:
            raise APIError(400, f"tools[{i}]: function name {function['name']!r} is given twice", "tools")
        schemas[function["name"]] = function
    req = ToolRequest(tools, schemas, parallel=body.get("parallel_tool_calls") is not False)
    choice = body.get("tool_choice")
    if choice is None:
        req.choice = "auto" if tools else "none"
    elif choice in ("none", "auto", "required"):
        req.choice = choice
    elif (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
          and isinstance(choice["function"].get("name"), str)):
        req.choice, req.named = choice["function"]["name"], True
        if req.choice not in schemas:
            raise APIError(400, f"'tool_choice' names {req.choice!r}, which is not in 'tools'", "tool_choice")
    else:
        raise APIError(400, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}", "tool_choice")
    if req.choice != "none" and not tools:
        raise APIError(400, f"'tool_choice' {choice!r} needs 'tools'", "tool_choice")
    return req


def _function(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise APIError(400, f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                            f"\"parameters\": ...}}}}", "tools")
    function = tool["function"]
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise APIError(400, f"{where}.function has unknown field(s) {', '.join(unknown)}", "tools")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise APIError(400, f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-'", "tools")
    if not isinstance(function.get("description", ""), str):
        raise APIError(400, f"{where}.function.description must be a string", "tools")
    params = function.get("parameters")
    if params is not None:
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise APIError(400, f"{where}.function.parameters must be a JSON schema of type object", "tools")
        props, required = params.get("properties", {}), params.get("required", [])
        if not isinstance(props, dict) or not all(isinstance(v, dict) for v in props.values()):
            raise APIError(400, f"{where}.function.parameters.properties must map names to schemas", "tools")
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            raise APIError(400, f"{where}.function.parameters.required must be a list of names", "tools")
    return function


def template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """``chat_template_kwargs``: extra variables for the template (``{"enable_thinking": false}``); the names
    the server sets itself are refused."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise APIError(400, f"'chat_template_kwargs' must be an object of at most {MAX_TEMPLATE_KWARGS} fields",
                       "chat_template_kwargs")
    if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise APIError(400, "'chat_template_kwargs' must be an object whose keys are identifiers",
                       "chat_template_kwargs")
    clash = sorted(RESERVED_KWARGS & set(kwargs))
    if clash:
        raise APIError(400, f"'chat_template_kwargs' may not set {', '.join(clash)}", "chat_template_kwargs")
    return kwargs
