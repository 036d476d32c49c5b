"""``/v1/completions`` and ``/v1/chat/completions``: prompts (and a chat's images) into choices, generated as one
group and answered whole or streamed over SSE."""

from __future__ import annotations

from dataclasses import replace

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agents.runtime.engine import LLMEngine, QueueFullError, RequestError
from agents.runtime.engine.multimodal import ImageInputs
from agents.runtime.engine.tokenizer import ChatFormatError
from agents.runtime.server.chat_output import ChatSettings
from agents.runtime.server.errors import APIError
from agents.runtime.server.handlers.common import ServerState, check_chars, read_body, tokenize
from agents.runtime.server.images import decode_images, image_parts, processor_for, with_placeholders
from agents.runtime.server.protocol import (
    MAX_CHOICES,
    Generation,
    chat_generation,
    completion_generation,
    completion_prompts,
)
from agents.runtime.server.render import ChatRenderer, Choice, Renderer
from agents.runtime.server.sse import SSEResponse, collect_unless_disconnected
from agents.runtime.server.structured import check_logit_bias
from agents.runtime.server.tools import template_kwargs, tool_request
from agents.runtime.server.tools_grammar import forced_call_grammar, forces


def token_id_text(token: int) -> str:
    """A token as vLLM's ``return_tokens_as_token_ids`` names it in logprobs: ``token_id:N``."""
    return f"token_id:{token}"


async def serve_choices(
    state: ServerState, request: Request, engine: LLMEngine, gen: Generation, choices: list[Choice],
    renderer_cls: type[Renderer], images: ImageInputs | None = None,
) -> Response:
    requests = [(c.prompt_ids, gen.choice_params(c.index % gen.n)) for c in choices]
    check_logit_bias(gen.params.logit_bias, engine.vocab_size)
    try:
        group = state.runtime.generate_group(requests, images)
    except RequestError as exc:
        raise APIError(400, str(exc), "prompt") from exc
    except QueueFullError as exc:
        raise APIError(429, str(exc), err_type="rate_limit_exceeded") from exc
    tok = engine.tokenizer
    token_text = token_id_text if gen.tokens_as_ids else tok.token_text  # exact ids for an endpoint client
    renderer = renderer_cls(state.model_name, request.state.request_id, gen, choices, token_text, tok.visible_len)
    if gen.stream:
        return SSEResponse(renderer.stream(group), group)
    outputs = await collect_unless_disconnected(request, group)
    if outputs is None:
        return Response(status_code=499)  # the client left; nobody reads this
    if gen.logprobs is None:
        return JSONResponse(renderer.whole(outputs))
    return JSONResponse(await run_in_threadpool(renderer.whole, outputs))  # token texts of every position


async def completions(state: ServerState, request: Request) -> Response:
    engine = state.ready_engine()
    body = await read_body(state, request)
    prompts = completion_prompts(body)
    gen = completion_generation(body, max_model_len=engine.max_model_len)
    if len(prompts) * gen.n > MAX_CHOICES:
        raise APIError(400, f"{len(prompts)} prompts x n={gen.n} choices is over {MAX_CHOICES} per request", "n")
    choices: list[Choice] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ids, text = await tokenize(engine, prompt, "prompt"), prompt
        elif len(prompt) >= engine.max_model_len:  # refused before decoding it for an echo
            raise APIError(400, f"prompt {i} is {len(prompt)} tokens, the model's context is "
                                f"{engine.max_model_len}", "prompt")
        elif not all(0 <= t < engine.vocab_size for t in prompt):
            raise APIError(400, f"prompt {i}: token ids must be in [0, {engine.vocab_size})", "prompt")
        else:
            ids, text = prompt, await run_in_threadpool(engine.tokenizer.decode, prompt) if gen.echo else ""
        for j in range(gen.n):
            choices.append(Choice(len(choices), ids, text, counts_prompt=j == 0))
    return await serve_choices(state, request, engine, gen, choices, Renderer)


async def chat_completions(state: ServerState, request: Request) -> Response:
    engine = state.ready_engine()
    body = await read_body(state, request)
    messages = body.get("messages")
    parts = image_parts(messages)
    processor = None
    if parts:
        if id(engine) not in state.processors:
            try:
                state.processors[id(engine)] = processor_for(engine.model_dir, engine.model)
            except FileNotFoundError as exc:
                raise APIError(500, f"cannot preprocess images: {exc}") from exc
        processor = state.processors[id(engine)]
        if processor is None:
            raise APIError(400, f"{parts[0][0]}: this model does not take images (a text-only model)",
                           parts[0][0])
        pictures = await run_in_threadpool(decode_images, messages, state.image_limits)
        messages = with_placeholders(messages, processor.placeholder)
    tools = tool_request(body)
    tool_parser, reasoning = state.chat_parsers(engine)
    if tools.parses and tool_parser is None:
        raise APIError(400, "'tools' cannot be served: this model's chat template declares no tool-call format "
                            "(start the server with --tool-call-parser NAME, or send tool_choice 'none')", "tools")
    try:
        text = await run_in_threadpool(engine.tokenizer.apply_chat_template, messages, True, template_kwargs(body),
                                       tools.tools or None)
    except ChatFormatError as exc:
        raise APIError(400, str(exc), "messages") from exc
    images = None
    if processor is not None:  # the model's processor: pixel values, each placeholder expanded
        check_chars(engine, text, "messages")
        ids, images = await run_in_threadpool(processor, text, pictures)
    else:
        ids = await tokenize(engine, text, "messages", add_special_tokens=False)  # the template writes the BOS
    gen = chat_generation(body, max_model_len=engine.max_model_len, prompt_tokens=len(ids))
    gen.chat = ChatSettings(tools, tool_parser, reasoning)
    if forces(tools) and tool_parser is not None:  # required or named: the grammar holds the model to the format
        if gen.params.grammar is not None:
            raise APIError(400, "'response_format' cannot be combined with a 'required' or named 'tool_choice'",
                           "response_format")
        grammar = await run_in_threadpool(forced_call_grammar, engine, tool_parser.name, tools,
                                          reasoning=reasoning, max_tokens=gen.params.max_tokens)
        gen.params = replace(gen.params, grammar=grammar)
        gen.chat.forced = True
    choices = [Choice(j, ids, "", counts_prompt=j == 0) for j in range(gen.n)]
    return await serve_choices(state, request, engine, gen, choices, ChatRenderer, images)
