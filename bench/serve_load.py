"""A bounded load test of kvo-serve on loopback: N chat requests, C at a time, their questions and
sampling seeds drawn from --seed, under a time limit. Every request must be answered (200, with
its usage) or refused with a status and a reason (503 from a full queue); afterwards no slot is in
use and nothing waits; the server's resident memory after the run is that after a warm-up run of
the same requests (within --rss-slack), so that nothing grows per request. Prints one JSON object
(requests/s, p50 and p99 latency of the answered ones, generated tokens/s, statuses, memory) and
writes it to --out when given.

    python serve_load.py --kvo-serve PATH --model FILE.gguf [--requests 200] [--concurrency 8]
        [--slots 4] [--queue 4] [--max-tokens 8] [--time-limit 600] [--out FILE.json]
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

QUESTIONS = [
    "What is the capital of France?", "Name a prime number.", "What colour is the sky?",
    "How many legs does a spider have?", "Say hello in Spanish.", "What is 7 times 8?",
    "Name a planet.", "What do bees make?", "Who wrote Hamlet?", "What is water made of?",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read().decode()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def run_load(url, requests, concurrency, max_tokens, seed, deadline):
    rng = random.Random(seed)
    bodies = [{"messages": [{"role": "user", "content": rng.choice(QUESTIONS)}],
               "max_tokens": max_tokens, "temperature": 0.7, "seed": rng.randrange(1 << 31)}
              for _ in range(requests)]

    def one(body):
        if time.time() > deadline:
            raise AssertionError("the time limit passed")
        start = time.perf_counter()
        status, reply = post(url + "/v1/chat/completions", body)
        return status, reply, time.perf_counter() - start

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, bodies))
    return results, time.perf_counter() - start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvo-serve", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--queue", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--time-limit", type=float, default=600)
    p.add_argument("--rss-slack-mib", type=float, default=16)
    p.add_argument("--out")
    args = p.parse_args()
    deadline = time.time() + args.time_limit

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [args.kvo_serve, "--model", args.model, "--backend", "host", "--port", str(port),
         "--slots", str(args.slots), "--queue", str(args.queue), "--max-seq", "1024"],
        stderr=subprocess.PIPE, text=True)
    log = []
    threading.Thread(target=lambda: log.extend(server.stderr), daemon=True).start()
    try:
        while True:
            assert server.poll() is None, log
            try:
                get(url + "/health")
                break
            except OSError:
                time.sleep(0.2)
            assert time.time() < deadline, "kvo-serve did not start"
        # A warm-up run of the same requests: the allocator and the pools settle.
        run_load(url, args.requests, args.concurrency, args.max_tokens, args.seed, deadline)
        rss_before = rss_kib(server.pid)
        results, seconds = run_load(url, args.requests, args.concurrency, args.max_tokens,
                                    args.seed, deadline)
        rss_after = rss_kib(server.pid)
        health = json.loads(get(url + "/health"))
        metrics = get(url + "/metrics")
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)

    statuses = {}
    for status, reply, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
        if status == 200:
            assert reply["usage"]["completion_tokens"] >= 1, reply
        else:
            assert status == 503 and reply["error"]["message"], (status, reply)
    answered = [t for status, _, t in results if status == 200]
    tokens = sum(r["usage"]["completion_tokens"] for s, r, _ in results if s == 200)
    assert answered, statuses
    assert health["slots_in_use"] == 0 and health["queued"] == 0, health
    assert "kvo_slots_in_use 0" in metrics
    assert rss_after - rss_before <= args.rss_slack_mib * 1024, (rss_before, rss_after)
    assert code == 0, log
    answered.sort()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout
    out = {
        "commit": commit.strip(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "model": args.model,
        "backend": "host", "requests": args.requests, "concurrency": args.concurrency,
        "slots": args.slots, "queue": args.queue, "max_tokens": args.max_tokens,
        "seconds": seconds, "requests_per_s": len(results) / seconds,
        "answered": statuses.get(200, 0), "refused_503": statuses.get(503, 0),
        "p50_latency_s": statistics.median(answered),
        "p99_latency_s": answered[min(len(answered) - 1, int(0.99 * len(answered)))],
        "generated_tokens_per_s": tokens / seconds,
        "rss_before_kib": rss_before, "rss_after_kib": rss_after,
    }
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
