"""Render the chaos tier's measured figures as the fault table of docs/faults.md.

    .venv/bin/pytest -m chaos            # appends one FAULT line per figure to the file below
    .venv/bin/python tools/fault_table.py [test-artifacts/faults.jsonl]

Takes the latest line of each fault and prints Markdown: fault, what a client sees, time to
recover, audit rows lost. Nothing here is typed by hand: every number comes from a test run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
Row = tuple[str, str, str]
NOT_MEASURED = "—"  # the test does not count audit rows for this fault


def _s(value: Any) -> str:
    seconds = float(value)
    return f"{seconds * 1000:.0f} ms" if seconds < 0.1 else f"{seconds:.1f} s"


def burst(d: dict[str, Any]) -> Row:
    answers = ", ".join(f"{n} × {s}" for s, n in sorted(d["statuses"].items()))
    sees = f"{answers}; p50 {_s(d['p50'])}, p99 {_s(d['p99'])} (queued behind swaps)"
    return (f"{sees}; peak {d['peak_children']} children",
            f"all answered in {_s(d['seconds'])}", NOT_MEASURED)  # fmt: skip


def fair_burst(d: dict[str, Any]) -> Row:
    answers = ", ".join(f"{n} × {s}" for s, n in sorted(d["statuses"].items()))
    return (f"{answers}; peak {d['peak_children']} children",
            f"all answered in {_s(d['seconds'])}", NOT_MEASURED)  # fmt: skip


def rpm_burst(d: dict[str, Any]) -> Row:
    heavy = ", ".join(f"{n} × {s}" for s, n in sorted(d["heavy"].items()))
    light = ", ".join(f"{n} × {s}" for s, n in sorted(d["light"].items()))
    return (f"the key: {heavy} (quota {d['quota']} a minute; each 429 names it, with "
            f"`Retry-After`); the other user: {light}",
            f"all answered in {_s(d['seconds'])}", NOT_MEASURED)  # fmt: skip


def hung_stream(d: dict[str, Any]) -> Row:
    return ("the stream ends with an SSE `error` event (503, \"stopped responding\"); a request "
            "queued for another model is served", f"slot free, other model served "
            f"{_s(d['queued_request_served_after'])} after SIGSTOP (hang-timeout "
            f"{d['hang_timeout']} s)", str(d["rows_lost"]))  # fmt: skip


def hung_plain(d: dict[str, Any]) -> Row:
    return ("`503` with `Retry-After: 1`, \"model name=… stopped responding …\"",
            f"answered {_s(d['answered_503_after'])} after SIGSTOP", NOT_MEASURED)  # fmt: skip


def prefill(d: dict[str, Any]) -> Row:
    return ("`200`: not killed (its /slots counters moved)", f"answered after "
            f"{_s(d['answered_after'])}", NOT_MEASURED)  # fmt: skip


def crash(d: dict[str, Any]) -> Row:
    gaps = ", ".join(f"{g:.1f}" for g in d["gaps_s"])
    return (f"`503` with `Retry-After` and the reason ({d['refused_503']} of {d['requests']} "
            f"requests); {d['children_started']} starts instead of {d['requests']}",
            f"starts {gaps} s apart; an explicit load starts it at once", NOT_MEASURED)  # fmt: skip


def flood(d: dict[str, Any]) -> Row:
    return (f"other models answer as before (p95 {d['p95_ms_before']} → "
            f"{d['p95_ms_while_flooding']} ms)", f"none needed; router CPU on the flood "
            f"{d['router_cpu_percent']:.0f}% of a core", NOT_MEASURED)  # fmt: skip


def kill9(d: dict[str, Any]) -> Row:
    return (f"the requests in flight at each kill fail; {d['swaps']} swaps over {d['kills']} "
            "kills, the database locked during one", f"the next start writes the journal: "
            f"{d['stored']} of {d['journal_rows']} rows stored once ({d['stored_incomplete']} "
            "marked incomplete)", str(d["rows_lost"]))  # fmt: skip


def redis_down(d: dict[str, Any]) -> Row:
    answers = []
    if 200 in d["answers_during"]:
        answers.append("`200` (the data path is the router's socket)")
    if 503 in d["answers_during"]:
        answers.append("`503` with `Retry-After` once the heartbeat is stale")
    slowest = _s(d["slowest_answer_s"])
    return (f"{', then '.join(answers)} (slowest answer {slowest}); the router "
            "keeps running with its children", f"served again "
            f"{_s(d['served_again_after_redis_back_s'])} after Redis is back",
            NOT_MEASURED)  # fmt: skip


def blip(d: dict[str, Any]) -> Row:
    return ("the dashboard's WebSocket stays open", f"fresh snapshot "
            f"{_s(d['fresh_snapshot_after_s'])} after the restart", NOT_MEASURED)  # fmt: skip


def router_killed(d: dict[str, Any]) -> Row:
    return (f"queued requests: `503 router unavailable` after "
            f"{_s(d['queued_request_answered_503_after_s'])}; `/ready` 503",
            f"restart not refused (up in {_s(d['restart_took_s'])}), served "
            f"{_s(d['served_again_after_restart_s'])} later", NOT_MEASURED)  # fmt: skip


def web_killed(d: dict[str, Any]) -> Row:
    return ("its clients' connections drop; others are not blocked", f"its socket to the router "
            f"closes and its lease ends: another client served "
            f"{_s(d['other_clients_served_after_s'])} after the kill", NOT_MEASURED)  # fmt: skip


def web_stopped(d: dict[str, Any]) -> Row:
    return (f"its stream ends with an SSE `error` event (503, \"server is shutting down\") "
            f"{_s(d['stream_error_after'])} after SIGTERM (`--shutdown-grace` {d['grace']:g} s), "
            "not cut mid-chunk", f"the web process exits {_s(d['web_exited_after'])} after "
            "SIGTERM; the router has the lease back and serves the next web process",
            NOT_MEASURED)  # fmt: skip


def router_killed_socket(d: dict[str, Any]) -> Row:
    return (f"`503 router unavailable` after {_s(d['queued_request_answered_503_after_s'])} "
            "(its socket closed)", f"served {_s(d['served_again_after_restart_s'])} after the "
            "restart began", NOT_MEASURED)  # fmt: skip


def frozen(d: dict[str, Any]) -> Row:
    return ("`503` (the heartbeat stopped)", "on resume the router drops what was given up on: "
            "nothing runs later; one `message_expired` row", NOT_MEASURED)  # fmt: skip


def database(d: dict[str, Any]) -> Row:
    return (f"nothing: {d['requests_served']} swaps served while PostgreSQL refused connections",
            f"rows stored {_s(d['stored_after_reopen_s'])} after it reopened",
            str(d["audit_rows_lost"]))  # fmt: skip


def disk_full(d: dict[str, Any]) -> Row:
    return (f"every request `200`: evictions, a spawn and a SIGKILLed child's exit all seen; "
            f"peak {d['peak_children']} child (models_max {d['models_max']}); `/ready` says "
            "`degraded` and what could not be written", f"state file, journal and database "
            f"written again {_s(d['recovered_after_space_back_s'])} after space came back, no "
            "restart", str(d.get("rows_lost", NOT_MEASURED)))  # fmt: skip


RENDER: dict[str, tuple[str, Callable[[dict[str, Any]], Row]]] = {
    "burst": ("300 concurrent requests, 3 models, models_max 2 (bench: 1,000)", burst),
    "fair share burst": ("300 concurrent requests of 3 owners, `--queue-policy fair`, "
                         "3 models, models_max 2", fair_burst),
    "rpm quota burst": ("a key with a requests-per-minute quota fires 120 at once, beside "
                        "another user's 60", rpm_burst),
    "hung child (SIGSTOP mid-stream)": ("a child hangs mid-stream (SIGSTOP)", hung_stream),
    "hung child (SIGSTOP, non-streamed)": ("a child hangs, non-streamed request", hung_plain),
    "long prompt, no output for 5 s (hang-timeout 1 s)": (
        "a long prompt: 5 s without output (hang-timeout 1 s)", prefill),
    "crash after every request": ("a child crashes after every request", crash),
    "child floods its output": ("a child floods its output", flood),
    "kill -9 of serve during swaps": ("`kill -9` of `serve` at random moments", kill9),
    "Redis down 1 s (team mode)": ("Redis down 1 s (team)", redis_down),
    "Redis down 10 s (team mode)": ("Redis down 10 s (team)", redis_down),
    "Redis restarted (0.1 s) under an open dashboard": ("Redis restarted under a dashboard", blip),
    "runrouter killed with SIGKILL (team mode)": ("`runrouter` killed (SIGKILL)", router_killed),
    "runrouter killed with SIGKILL, a request queued on the socket (team mode)": (
        "`runrouter` killed (SIGKILL), a request queued on its socket", router_killed_socket),
    "a web process killed with SIGKILL mid-stream (team mode, lease ttl 3 s)": (
        "a web process killed mid-stream (lease ttl 3 s)", web_killed),
    "a web process killed with SIGKILL mid-stream (team mode, socket, lease ttl 120 s)": (
        "a web process killed mid-stream (lease ttl 120 s)", web_killed),
    "team web process stopped mid-stream": (
        "a web process stopped (SIGTERM) mid-stream (team)", web_stopped),
    "router frozen (SIGSTOP) while requests arrive": ("the router frozen (SIGSTOP)", frozen),
    "data dir full (tmpfs)": ("the data dir's disk full (a 24 MB tmpfs filled)", disk_full),
    "PostgreSQL refuses connections during 4 swaps (team mode)": (
        "PostgreSQL refuses connections (team)", database),
}  # fmt: skip


def table(lines: list[str]) -> str:
    latest: dict[str, dict[str, Any]] = {}
    for line in lines:
        if line.strip():
            record = json.loads(line)
            latest[record["fault"]] = record
    out = ["| fault | what a client sees | recovery (measured) | audit rows lost |",
           "|---|---|---|---|"]  # fmt: skip
    for key, (label, render) in RENDER.items():
        if key in latest:
            sees, recovery, lost = render(latest[key])
            out.append(f"| {label} | {sees} | {recovery} | {lost} |")
    return "\n".join(out)


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "test-artifacts" / "faults.jsonl"
    print(table(path.read_text().splitlines()))


if __name__ == "__main__":
    main()
