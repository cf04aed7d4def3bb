"""One bounded chat completion through litellm, with the accounting the IR records.

Every provider litellm knows works from config alone (model string, optional api_base); keys come from the
environment. Rate limits (429), server errors (5xx), connection errors and timeouts are retried with
exponential backoff, at most ``llm.max_retries`` times and never past ``llm.total_timeout_s``; then the call
fails with a :class:`CallFailed` carrying what was spent, and the action is recorded as failed.
"""

from __future__ import annotations

import bisect
import itertools
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any

RETRYABLE = ("rate-limit", "server", "timeout", "connection")


class CallFailed(RuntimeError):
    def __init__(self, message: str, record: dict[str, Any]):
        super().__init__(message)
        self.record = {**record, "error": message}


@dataclass
class Reply:
    text: str
    record: dict[str, Any]  # model, tokens, cost, seconds, retries: one entry of the action's attempts


def _litellm() -> Any:
    # No network here, and no phoning home anywhere: the bundled price map, no telemetry.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    with warnings.catch_warnings():  # pydantic warns about litellm's own types at import; not ours to fix
        warnings.simplefilter("ignore")
        import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm


def classify(exc: BaseException, litellm: Any) -> str | None:
    """Which transient failure ``exc`` is, or None when retrying cannot help (bad request, auth, ...)."""
    if isinstance(exc, litellm.Timeout):
        return "timeout"
    code = getattr(exc, "status_code", None)
    if code == 429 or isinstance(exc, litellm.RateLimitError):
        return "rate-limit"
    if isinstance(code, int) and code >= 500:
        return "server"
    if isinstance(exc, (litellm.InternalServerError, litellm.ServiceUnavailableError, litellm.BadGatewayError)):
        return "server"
    if isinstance(exc, litellm.APIConnectionError):
        return "connection"
    return None


class LLMClient:
    def __init__(self, cfg: Any, sleep: Any = time.sleep):
        """``cfg`` is the campaign's ``llm`` section."""
        self.cfg = cfg
        self.litellm = _litellm()
        self._sleep = sleep
        self._cum = list(itertools.accumulate(float(m.weight) for m in cfg.models))

    def pick(self, u: float) -> Any:
        """The model whose weight interval holds ``u`` in [0, 1) (the trial samples u, so TPE can learn)."""
        i = bisect.bisect_right(self._cum, u * self._cum[-1])
        return self.cfg.models[min(i, len(self.cfg.models) - 1)]

    def complete(self, model: Any, messages: list[dict[str, str]], deadline: float | None = None) -> Reply:
        """``deadline`` (time.monotonic) bounds the whole action: retries and a repair attempt share it."""
        cfg, lit = self.cfg, self.litellm
        t0 = time.monotonic()
        deadline = deadline if deadline is not None else t0 + cfg.total_timeout_s
        record: dict[str, Any] = {"model": model.model, "prompt_tokens": 0, "completion_tokens": 0,
                                  "cost_usd": 0.0, "retries": 0, "errors": []}
        kwargs: dict[str, Any] = {}
        if model.api_base:
            kwargs["api_base"] = model.api_base
        if model.api_key_env:
            key = os.environ.get(model.api_key_env)
            if not key:
                raise CallFailed(f"environment variable {model.api_key_env} (llm.models api_key_env of "
                                 f"{model.model}) is not set", record)
            kwargs["api_key"] = key
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CallFailed(f"total time {cfg.total_timeout_s:g} s used after {record['retries']} "
                                 f"retries: {'; '.join(record['errors'][-2:])}", _done(record, t0))
            try:
                resp = lit.completion(model=model.model, messages=messages, temperature=model.temperature,
                                      max_tokens=cfg.max_output_tokens, timeout=min(cfg.timeout_s, left),
                                      num_retries=0, max_retries=0, **kwargs)
            except Exception as e:  # litellm maps every provider's errors onto its own exception types
                kind = classify(e, lit)
                record["errors"].append(f"{kind or type(e).__name__}: {str(e).splitlines()[0][:200]}")
                if kind is None:
                    raise CallFailed(f"not retryable: {record['errors'][-1]}", _done(record, t0)) from e
                if record["retries"] >= cfg.max_retries:
                    raise CallFailed(f"{record['retries'] + 1} attempts failed, last {record['errors'][-1]}",
                                     _done(record, t0)) from e
                wait = max(cfg.backoff_s * 2 ** record["retries"], _retry_after(e))
                wait = min(wait, deadline - time.monotonic())
                if wait < 0:
                    continue  # the loop head reports the spent total
                record["retries"] += 1
                self._sleep(wait)
                continue
            usage = getattr(resp, "usage", None)
            record["prompt_tokens"] = int(getattr(usage, "prompt_tokens", 0) or 0)
            record["completion_tokens"] = int(getattr(usage, "completion_tokens", 0) or 0)
            record["cost_usd"] = self.cost(model, resp, record)
            text = resp.choices[0].message.content or ""
            return Reply(text, _done(record, t0))

    def cost(self, model: Any, resp: Any, record: dict[str, Any]) -> float:
        if model.input_usd_per_mtok is not None or model.output_usd_per_mtok is not None:
            return (record["prompt_tokens"] * (model.input_usd_per_mtok or 0.0)
                    + record["completion_tokens"] * (model.output_usd_per_mtok or 0.0)) / 1e6
        try:
            return float(self.litellm.completion_cost(completion_response=resp) or 0.0)
        except Exception:  # noqa: BLE001 - a local or unpriced model: litellm has no price for it, so it costs nothing here
            return 0.0


def _retry_after(exc: BaseException) -> float:
    """The server's Retry-After (seconds), when a 429/503 carries one; 0 otherwise."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    try:
        return float(headers.get("retry-after", 0)) if headers is not None else 0.0
    except (TypeError, ValueError):
        return 0.0  # an HTTP date: rare; exponential backoff covers it


def _done(record: dict[str, Any], t0: float) -> dict[str, Any]:
    record["seconds"] = round(time.monotonic() - t0, 3)
    return record
