"""Count prompt and generated tokens and render them as llama.cpp's Prometheus /metrics text."""

from __future__ import annotations

import threading
import time

from routerpanel.router.simserver.completions import PROMPT_MS_PER_TOKEN, Run


class Stats:
    """Count what /metrics reports, under llama.cpp's metric names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = int(time.time())
        self._prompt_tokens = 0
        self._prompt_s = 0.0
        self._predicted_tokens = 0
        self._predicted_s = 0.0
        self._decodes = 0
        self._tokens_max = 0

    def record(self, run: Run) -> None:
        with self._lock:
            self._prompt_tokens += run.plan.prompt_n
            self._prompt_s += run.plan.prompt_n * PROMPT_MS_PER_TOKEN / 1000
            self._predicted_tokens += run.n_generated
            self._predicted_s += run.predicted_ms / 1000
            self._decodes += 1 + run.n_generated
            self._tokens_max = max(self._tokens_max, run.plan.prompt_n + run.n_generated)

    def render(self, processing: int, deferred: int) -> str:
        """Render Prometheus text like llama.cpp's ``to_metrics()``."""
        with self._lock:
            counters = [
                ("prompt_tokens_total", "Number of prompt tokens processed", self._prompt_tokens),
                ("prompt_seconds_total", "Total time spent processing prompts", self._prompt_s),
                (
                    "tokens_predicted_total",
                    "Number of generation tokens processed",
                    self._predicted_tokens,
                ),
                (
                    "tokens_predicted_seconds_total",
                    "Total time spent generating tokens",
                    self._predicted_s,
                ),
                ("n_decode_total", "Total number of llama_decode() calls", self._decodes),
                ("n_tokens_max", "Largest observed sequence length", self._tokens_max),
            ]
            gauges = [
                (
                    "prompt_tokens_seconds",
                    "Average prompt throughput in tokens/s",
                    _rate(self._prompt_tokens, self._prompt_s),
                ),
                (
                    "predicted_tokens_seconds",
                    "Average generation throughput in tokens/s",
                    _rate(self._predicted_tokens, self._predicted_s),
                ),
                ("requests_processing", "Number of requests processing", processing),
                ("requests_deferred", "Number of requests deferred", deferred),
            ]
        lines = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, text, value in items:
                lines += [f"# HELP llamacpp:{name} {text}", f"# TYPE llamacpp:{name} {kind}"]
                lines.append(f"llamacpp:{name} {value:g}")
        return "\n".join(lines) + "\n"


def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0
