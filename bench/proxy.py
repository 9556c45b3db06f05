"""Per-request overhead and streaming throughput: RouterPanel and llama.cpp's router vs direct.

    .venv/bin/python bench/proxy.py [--requests 200] [--rounds 15] [--out FILE]

Two children, each measured against itself:

* the real llama-server with the tiny GGUF model (2.8 MB), behind RouterPanel (``manage.py serve
  --models-preset same.ini``, and a second one with ``--http uvicorn``) and behind llama.cpp's own
  router (``llama-server --models-preset same.ini``) — the same INI, so every router runs the
  same child command — and, when PostgreSQL and Redis answer on 127.0.0.1, behind team mode
  (``runrouter`` + ``serve --no-router``, a throw-away database and Redis prefix);
* the simulated llama-server (``routerpanel.router.simserver``), behind RouterPanel only
  (llama.cpp's router can only start its own binary).

"direct" is a request to the very child process the router forwards to (its port is read from
the child's argv), so router and direct share the child, its threads and its caches. Requests are
paired and interleaved: each round sends one request to every target, in a shuffled order, and
the overhead is the median of the per-round differences (router − its direct), which cancels
most of the drift of a busy machine. Routes: ``/tokenize`` and a 32-token chat completion
(``ignore_eos``, so every answer has 32 tokens); connection reuse on (one keep-alive connection
per target) and off (a new connection per request, ``Connection: close``).

Streaming: 1 and 16 concurrent streamed chat completions of 256 tokens each, all started
together; throughput = tokens received / wall time until the last stream ended; the median of
``--rounds`` rounds, targets interleaved. For each router, its own process's CPU time per token
received over the same rounds (team mode: the web process's and runrouter's together).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common
from bench.common import Client, Proc, Processes, Table

MODEL = "tiny"
SIM = "sim"
TOKENIZE = {"content": "Hello world, this is a benchmark of the proxy."}
CHAT = {
    "messages": [{"role": "user", "content": "Say something."}],
    "max_tokens": 32,
    "ignore_eos": True,
    "temperature": 0,
}
STREAM_TOKENS = 256
TEAM = "RouterPanel team (serve --no-router + runrouter)"
TEAM_UV = "RouterPanel team, web on uvicorn (serve --no-router --http uvicorn)"
DELAYED_ACK_SUSPECT = 0.030  # s: a direct JSON answer this slow on loopback is a Nagle stall


@dataclass(frozen=True)
class Target:
    label: str
    port: int
    model: str
    baseline: str | None = None  # label of the direct target this one is compared with
    # The router's own processes (team mode: the web process and runrouter): their CPU per
    # streamed token.
    router_pids: tuple[int, ...] = ()


def payload(route: str, model: str, **extra: object) -> bytes:
    body = TOKENIZE if route == "/tokenize" else CHAT
    return json.dumps({**body, "model": model, **extra}).encode()


# ---- per-request overhead -------------------------------------------------------------------


def overhead(
    child: str,
    targets: Sequence[Target],
    requests: int,
    rng: random.Random,
    table: Table,
    seen: dict[str, float] | None = None,
) -> dict[str, float]:
    """Add rows for every route × reuse; return the direct medians (for the notes). ``seen``
    gets each router's overhead in seconds, keyed ``"<route> <reuse|new> <label>"``."""
    direct_medians: dict[str, float] = {}
    for route, route_label in (("/tokenize", "/tokenize"), ("/v1/chat/completions", "chat 32")):
        for reuse in (True, False):
            samples = interleave(targets, route, reuse, requests, rng)
            for t in targets:
                mine = samples[t.label]
                cells = [child, route_label, "reuse" if reuse else "new", t.label]
                cells += [common.ms(common.median(mine)), common.ms(common.p95(mine))]
                if t.baseline is None:
                    direct_medians[f"{route_label} {reuse}"] = common.median(mine)
                    table.add(*cells, "baseline", "1.00")
                    continue
                base = samples[t.baseline]
                diffs = [a - b for a, b in zip(mine, base, strict=True)]
                ratio = common.median(mine) / common.median(base)
                table.add(*cells, common.signed_ms(common.median(diffs)), f"{ratio:.2f}")
                if seen is not None:
                    seen[" ".join(cells[1:4])] = common.median(diffs)
    return direct_medians


def interleave(
    targets: Sequence[Target], route: str, reuse: bool, requests: int, rng: random.Random
) -> dict[str, list[float]]:
    clients = {t.label: Client(t.port, reuse=reuse) for t in targets}
    bodies = {t.label: payload(route, t.model) for t in targets}
    samples: dict[str, list[float]] = {t.label: [] for t in targets}
    try:
        for i in range(requests + 10):  # the first 10 rounds warm up and are dropped
            order = list(targets)
            rng.shuffle(order)
            for t in order:
                elapsed, status, body = clients[t.label].post(route, bodies[t.label])
                if status != 200:
                    raise RuntimeError(f"{t.label} {route} answered {status}: {body[:300]!r}")
                if i >= 10:
                    samples[t.label].append(elapsed)
    finally:
        for client in clients.values():
            client.close()
    return samples


def check_chat_length(targets: Sequence[Target]) -> None:
    for t in targets:
        _, status, body = Client(t.port, reuse=False).post(
            "/v1/chat/completions", payload("/v1/chat/completions", t.model)
        )
        tokens = json.loads(body)["usage"]["completion_tokens"]
        if status != 200 or tokens != CHAT["max_tokens"]:
            raise RuntimeError(f"{t.label}: chat gave {status} with {tokens} tokens")


# ---- streaming throughput -------------------------------------------------------------------


def stream_once(port: int, body: bytes) -> int:
    """Run one streamed chat on a new connection; return the tokens it carried.

    A raw socket and large reads: the client only collects bytes while the stream runs and
    counts the token events once it has ended, so its own cost per token stays small and equal
    for every target (a line-by-line client was the bottleneck at 16 streams).
    """
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {common.HOST}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    received = bytearray()
    with socket.create_connection((common.HOST, port), timeout=300) as sock:
        sock.sendall(head + body)
        while chunk := sock.recv(262144):
            received += chunk
    status, _, payload = bytes(received).partition(b"\r\n\r\n")
    if b" 200 " not in status.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"stream on port {port} answered {status[:200]!r}")
    if b"chunked" in status.lower():
        payload = dechunk(payload)
    return payload.count(b'"content":"')  # one per token event; the role chunk has null


def dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        eol = data.index(b"\r\n", pos)
        size = int(data[pos:eol].split(b";", 1)[0], 16)
        if size == 0:
            return bytes(out)
        out += data[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


def stream_round(t: Target, concurrency: int) -> tuple[float, int, float | None]:
    """Start ``concurrency`` streams at once; return tokens per second over the wall time, the
    tokens, and the router process's own CPU seconds over the round (None for a direct one)."""
    body = payload("/v1/chat/completions", t.model, stream=True, max_tokens=STREAM_TOKENS)
    barrier = threading.Barrier(concurrency + 1)
    counts: list[int] = []
    errors: list[BaseException] = []
    routers = [psutil.Process(pid) for pid in t.router_pids]

    def run() -> None:
        barrier.wait()
        try:
            counts.append(stream_once(t.port, body))
        except BaseException as exc:  # reported below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    cpu_before = cpu_seconds(routers)
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join(600)
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{t.label}: {errors[0]}")
    tokens = sum(counts)
    cpu = cpu_seconds(routers) - cpu_before if routers else None
    return tokens / wall, tokens, cpu


def paired_order(targets: Sequence[Target], rng: random.Random) -> list[Target]:
    """One round's order: each direct child next to the routers measured against it (in a
    shuffled order within the group), the groups shuffled. A router and its baseline then run
    a few seconds apart instead of up to a whole round (about 10 s with nine targets): what the
    machine does in between moves both, not one side of the ratio. (In one run of 2026-12-07,
    four identical children's 16-stream medians ranged from 3,023 to 3,693 tokens/s.)"""
    groups: dict[str, list[Target]] = {}
    for t in targets:
        groups.setdefault(t.baseline or t.label, []).append(t)
    order = list(groups.values())
    rng.shuffle(order)
    for group in order:
        rng.shuffle(group)
    return [t for group in order for t in group]


def cpu_seconds(processes: Sequence[psutil.Process]) -> float:
    times = [process.cpu_times() for process in processes]
    return float(sum(t.user + t.system for t in times))


def streaming(
    child: str,
    targets: Sequence[Target],
    rounds: int,
    rng: random.Random,
    table: Table,
    seen: dict[str, float] | None = None,
) -> None:
    """Add rows for 1 and 16 streams; ``seen`` gets, for 16 streams, each router's tokens/s
    against its direct (``"x <label>"``) and its CPU seconds per token (``"cpu <label>"``)."""
    for concurrency in (1, 16):
        results: dict[str, list[float]] = {t.label: [] for t in targets}
        cpu: dict[str, float] = dict.fromkeys((t.label for t in targets), 0.0)
        tokens: dict[str, int] = dict.fromkeys((t.label for t in targets), 0)
        for t in targets:  # warm-up round, dropped
            stream_round(t, concurrency)
        for _ in range(rounds):
            for t in paired_order(targets, rng):
                tps, n, seconds = stream_round(t, concurrency)
                results[t.label].append(tps)
                tokens[t.label] += n
                cpu[t.label] += seconds or 0.0
        for t in targets:
            tps = common.median(results[t.label])
            vs = "baseline"
            if t.baseline is not None:
                # Paired by round, as the latencies are: each round measures a router and its
                # direct child within seconds of each other, so the child's own drift between
                # rounds (a few %, with 2 cores shared by everything) cancels out.
                pairs = zip(results[t.label], results[t.baseline], strict=True)
                ratios = [mine / direct for mine, direct in pairs]
                ratio = common.median(ratios)
                vs = f"{ratio:.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
                if seen is not None and concurrency > 1:
                    seen[f"x {t.label}"] = ratio
                    seen[f"cpu {t.label}"] = cpu[t.label] / tokens[t.label]
            # One stream's rounds use a few clock ticks of CPU in all: too coarse to show.
            shown = bool(t.router_pids) and concurrency > 1
            cpu_cell = f"{cpu[t.label] / tokens[t.label] * 1e6:.0f}" if shown else ""
            table.add(child, concurrency, t.label, f"{tps:,.0f}", vs, cpu_cell)


# ---- set-up ---------------------------------------------------------------------------------


def three_routers(procs: Processes, work: Path) -> tuple[Path, Path, tuple[Proc, Proc, Proc]]:
    """``serve`` on Daphne, ``serve --http uvicorn`` and llama.cpp's router on one INI, each
    with the tiny model loaded; return the INI, the llama-server binary and the three."""
    server_bin = common.llama_server_bin()
    ini = work / "same.ini"
    ini.write_text(common.preset_ini(common.tiny_models()))
    rp = common.start_routerpanel(procs, ini, 2, server_bin=server_bin)
    uv = common.start_routerpanel(
        procs, ini, 2, server_bin=server_bin, name="routerpanel-uvicorn",
        env={"ROUTERPANEL_HTTP": "uvicorn"},
    )  # fmt: skip
    llama = common.start_llama_router(procs, server_bin, ini, 2)
    for router in (rp, uv, llama):
        common.load_by_request(router, MODEL)
    return ini, server_bin, (rp, uv, llama)


def real_targets(
    procs: Processes, work: Path, team: tuple[str, str] | None, notes: list[str]
) -> list[Target]:
    ini, server_bin, (rp, uv, llama) = three_routers(procs, work)
    targets = [
        Target("direct (RouterPanel's child)", common.child_port(rp, MODEL), MODEL),
        Target("RouterPanel", rp.port or 0, MODEL, "direct (RouterPanel's child)", (rp.pid,)),
        Target("direct (uvicorn's child)", common.child_port(uv, MODEL), MODEL),
        Target(
            "RouterPanel --http uvicorn", uv.port or 0, MODEL, "direct (uvicorn's child)",
            (uv.pid,),
        ),
        Target("direct (llama.cpp's child)", common.child_port(llama, MODEL), MODEL),
        Target(
            "llama.cpp router", llama.port or 0, MODEL, "direct (llama.cpp's child)", (llama.pid,)
        ),
    ]  # fmt: skip
    if team is None:
        notes.append("team mode: PostgreSQL or Redis not reachable on 127.0.0.1, not measured")
        return targets
    runrouter, (web, web_uv) = common.start_team_webs(
        procs, ini, 2, *team, server_bin=server_bin, servers=("daphne", "uvicorn")
    )
    common.load_by_request(web, MODEL)
    return [
        *targets,
        Target("direct (team's child)", common.child_port(web, MODEL), MODEL),
        Target(TEAM, web.port or 0, MODEL, "direct (team's child)", (web.pid, runrouter.pid)),
        Target(
            TEAM_UV, web_uv.port or 0, MODEL, "direct (team's child)", (web_uv.pid, runrouter.pid)
        ),
    ]  # fmt: skip


def sim_targets(procs: Processes, work: Path) -> list[Target]:
    ini = work / "sim.ini"
    ini.write_text(common.sim_ini([SIM]))
    rp: Proc = common.start_routerpanel(procs, ini, 2, name="routerpanel-sim")
    common.load_by_request(rp, SIM)
    return [
        Target("direct (simserver)", common.child_port(rp, SIM), SIM),
        Target("RouterPanel", rp.port or 0, SIM, "direct (simserver)", (rp.pid,)),
    ]


def run(requests: int = 200, rounds: int = 15, seed: int = 11434) -> list[Table]:
    """Measure everything; return the two tables."""
    rng = random.Random(seed)
    per_request = Table(
        f"Per-request overhead ({requests} paired, interleaved requests per row)",
        ["child", "route", "connection", "target", "median ms", "p95 ms",
         "overhead ms (median of paired diffs)", "× direct"],
    )  # fmt: skip
    streams = Table(
        f"Streamed tokens per second ({STREAM_TOKENS}-token chats, median of {rounds} rounds)",
        ["child", "streams", "target", "tokens/s", "× direct", "router CPU µs/token"],
    )
    notes: list[str] = []
    seen: dict[str, float] = {}
    with (
        common.workdir("proxy") as work,
        Processes(work) as procs,
        common.team_services("rp_proxy") as team,
    ):
        real = real_targets(procs, work, team, notes)
        sim = sim_targets(procs, work)
        check_chat_length(real + sim)
        overhead("llama-server", real, requests, rng, per_request, seen)
        sim_direct = overhead("simserver", sim, requests, rng, per_request)
        streaming("llama-server", real, rounds, rng, streams, seen)
        streaming("simserver", sim, rounds, rng, streams)
    per_request.notes += notes + delayed_ack_notes(sim_direct)
    streams.notes.append(
        "× direct: the median over rounds of each round's tokens/s divided by its direct "
        "child's in the same round, and in brackets the lowest and highest of those ratios "
        "(every target once per round; each direct child runs next to the routers measured "
        "against it, the groups and the order within each shuffled)."
    )
    streams.notes.append(
        "router CPU µs/token (16 streams): the router process's own user + system CPU time "
        "over all rounds (psutil, children not counted) divided by the tokens its clients "
        "received. One stream's rounds take a few 10 ms clock ticks of CPU in all, too coarse "
        "to show."
    )
    return [targets_table(seen), per_request, streams]


# ---- issue 16's targets, from the figures above ---------------------------------------------

LLAMA = "llama.cpp router"
ROUTERS = ("RouterPanel", "RouterPanel --http uvicorn", TEAM, TEAM_UV, LLAMA)


def targets_table(seen: dict[str, float]) -> Table:
    """One row per figure of issue 16, each router's value from this run, and the target."""
    table = Table(
        "The data plane against llama.cpp's router (issue 16; llama-server child, this run)",
        ["figure", "RouterPanel (Daphne)", "--http uvicorn", "team", "team, web on uvicorn",
         "llama.cpp router", "target"],
    )  # fmt: skip

    def cells(key: str, scale: float | None, fmt: str) -> list[str]:
        out = []
        for label in ROUTERS:
            value = seen.get(f"{key}{label}")
            out.append("" if value is None or not scale else fmt.format(value / scale))
        return out

    for route in ("/tokenize", "chat 32"):
        for conn in ("reuse", "new"):
            key = f"{route} {conn} "
            llama = seen.get(key + LLAMA)
            table.add(f"{route}, {conn}: added ms", *cells(key, 1e-3, "{:+.2f}"), "")
            table.add(
                f"{route}, {conn}: added ÷ llama.cpp's", *cells(key, llama, "{:.2f}"),
                "Daphne ≤ 1.5, uvicorn ≤ 1.0, team ≤ 2.0",
            )  # fmt: skip
    table.add("16 streams: tokens/s ÷ direct", *cells("x ", 1.0, "{:.2f}"), "≥ 0.92")
    table.add("16 streams: router CPU µs per token", *cells("cpu ", 1e-6, "{:.0f}"), "")
    llama_cpu = seen.get("cpu " + LLAMA)
    table.add("16 streams: CPU per token ÷ llama.cpp's", *cells("cpu ", llama_cpu, "{:.2f}"),
              "≤ 1.2")  # fmt: skip
    table.notes.append(
        "Added ms: median of the paired differences router − its own direct child, as in the "
        "per-request table below; the ratios divide each router's by llama.cpp's router's from "
        "the same run."
    )
    return table


def delayed_ack_notes(direct: dict[str, float]) -> list[str]:
    slow = {k: v for k, v in direct.items() if v >= DELAYED_ACK_SUSPECT}
    if not slow:
        return [
            "simserver direct answers show no delayed-ACK stall (every direct median < "
            f"{DELAYED_ACK_SUSPECT * 1000:.0f} ms)."
        ]
    rows = ", ".join(f"{k.replace(' True', ' reuse').replace(' False', ' new')} "
                     f"{v * 1000:.1f} ms" for k, v in slow.items())  # fmt: skip
    return [
        "simserver rows are not a measure of RouterPanel: the simulated server writes the "
        "headers and the body of a JSON answer in two sends without TCP_NODELAY, so on a reused "
        "connection the body waits for the client's delayed ACK, about 40 ms (direct with reuse: "
        f"{rows}; a new connection starts in quick-ACK mode and is not hit). RouterPanel reuses "
        "its connection to the child, so its simserver rows carry the same stall (about 40 ms "
        "even when the client opens a new connection; with client reuse some requests escape "
        "it, hence a median below direct). Use the llama-server rows."
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="paired requests per row (200)")
    parser.add_argument("--rounds", type=int, default=15, help="streaming rounds per row (15)")
    parser.add_argument("--out", type=Path, help="also write the Markdown tables here")
    args = parser.parse_args(argv)
    common.report(run(args.requests, args.rounds), args.out)


if __name__ == "__main__":
    main()
