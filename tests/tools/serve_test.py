"""kvo-serve on SmolLM2-135M-Instruct (its GGUF file), on the host backend, through the OpenAI
Python client and through raw sockets:

- the client's chat and completions, streamed and not, greedy: the text kvo-generate gives for
  the same prompt;
- two clients at once each get the answer they get alone;
- a long prompt is prefilled a piece at a time between the steps of a running request, and
  neither answer changes;
- a second question after a long shared document (the Apache License 2.0) prefills only what
  differs: usage's cached_tokens and /metrics count the reused tokens, and the answer is
  kvo-generate's for the whole prompt;
- every slot busy and the queue full: 503 with a reason; the server then serves again;
- hostile requests (malformed, truncated and non-object JSON, a huge body, wrong types, negative
  and huge max_tokens, an unknown role, unknown fields, the wrong API key, a client that goes
  away mid-stream, a client that reads none of a long stream, a client that sends half a request
  and nothing more): the right status, and the next request is served; no slot is left in use;
- SIGTERM while two requests run and one waits: the two complete, the waiting one gets 503, and
  the server exits 0;
- --contexts DIR: the slots' rows survive a restart (the document's prefix reused at once), and
  contexts saved with another slot count are refused without being overwritten.

    python serve_test.py --kvo-serve PATH --kvo-generate PATH --model FILE.gguf
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import openai

DOCUMENT = "/usr/share/common-licenses/Apache-2.0"
KEY = "test-key"
# Both tools multiply the GGUF blocks with f32 activations: the answer after a reused prefix is
# then the answer of one whole prefill to the bit (with q8 activations, the prefill's rows are
# quantized in pieces that differ, and a late token may flip).
MODEL_ARGS = ["--backend", "host", "--chunk", "256", "--activations", "f32"]
QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow."]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tool, model, *extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [tool, "--model", model, *MODEL_ARGS, "--port", str(self.port),
             "--api-key", KEY, "--slots", "2", "--queue", "2", "--max-seq", "4096",
             "--max-tokens", "256", "--max-body", "1MiB", "--shutdown-deadline", "300",
             "--prefill-piece", "256", *extra],
            stderr=subprocess.PIPE, text=True)
        self.log = []
        threading.Thread(target=lambda: self.log.extend(self.process.stderr), daemon=True).start()
        deadline = time.time() + 300
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"kvo-serve exited {self.process.returncode}: {self.log}")
            try:
                if self.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise AssertionError("kvo-serve did not answer /health in 300 s")
            time.sleep(0.2)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0,
                                    timeout=300)

    def request(self, method, path, body=None, headers=None, key=KEY):
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        h = {"Content-Type": "application/json", **(headers or {})}
        if key:
            h["Authorization"] = "Bearer " + key
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def metrics(self):
        status, text = self.get("/metrics")
        assert status == 200, (status, text)
        return {m.group(1): float(m.group(2))
                for m in re.finditer(r"^(kvo_\w+) (\S+)$", text, re.M)}

    def health(self):
        return json.loads(self.get("/health")[1])

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            return self.process.wait(timeout=60)
        return self.process.returncode


def kvo_generate(tool, model, prompt_args, max_new):
    run = subprocess.run([tool, "--model", model, *MODEL_ARGS, "--json",
                          "--quiet", "--max-new", str(max_new), *prompt_args],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])["text"][0]


def chat(server, question, max_tokens=24, **kw):
    r = server.client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": question}], temperature=0,
        max_tokens=max_tokens, **kw)
    return r


def check_equals_kvo_generate(server, args):
    for q in QUESTIONS:
        want = kvo_generate(args.kvo_generate, args.model, ["--chat", "--prompt", q], 24)
        r = chat(server, q)
        got = r.choices[0].message.content
        assert got == want, (q, got, want)
        assert r.usage.completion_tokens <= 24 and r.usage.prompt_tokens > 10, r.usage
        assert r.choices[0].finish_reason in ("stop", "length")
        stream = server.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": q}], temperature=0, max_tokens=24,
            stream=True, stream_options={"include_usage": True})
        pieces, usage = [], None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                pieces.append(c.delta.content or "")
        assert "".join(pieces) == want, ("".join(pieces), want)
        assert usage is not None and usage.completion_tokens == r.usage.completion_tokens
    # Completions: a plain prompt, streamed and not.
    prompt = "The three primary colours are"
    want = kvo_generate(args.kvo_generate, args.model, ["--prompt", prompt], 16)
    r = server.client.completions.create(model="m", prompt=prompt, temperature=0, max_tokens=16)
    assert r.choices[0].text == want, (r.choices[0].text, want)
    streamed = "".join(c.choices[0].text for c in server.client.completions.create(
        model="m", prompt=prompt, temperature=0, max_tokens=16, stream=True) if c.choices)
    assert streamed == want, (streamed, want)
    print("chat and completions, streamed and not: kvo-generate's text")


def check_two_at_once(server):
    alone = [chat(server, q).choices[0].message.content for q in QUESTIONS]
    got = [None, None]

    def ask(i):
        got[i] = chat(server, QUESTIONS[i]).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == alone, (got, alone)
    print("two clients at once: each the answer it gets alone")


def check_prefix_reuse(server, args):
    with open(DOCUMENT, encoding="utf-8") as f:
        document = f.read()[:6000]  # about 1,300 tokens
    before = server.metrics()
    first = chat(server, document + "\n\nWhat is this document?", max_tokens=16)
    # The other slot holds the document now; this question takes it.
    question = document + "\n\nWho may grant a patent license under it?"
    r = chat(server, question, max_tokens=16)
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert cached > 1000, r.usage
    after = server.metrics()
    assert after["kvo_prompt_tokens_reused_total"] - before["kvo_prompt_tokens_reused_total"] \
        >= cached, (before, after)
    assert after["kvo_prefix_cache_hits_total"] > before["kvo_prefix_cache_hits_total"]
    prefilled = after["kvo_prompt_tokens_total"] - before["kvo_prompt_tokens_total"]
    first_cached = first.usage.prompt_tokens_details.cached_tokens
    assert prefilled == (first.usage.prompt_tokens - first_cached) + (r.usage.prompt_tokens -
                                                                      cached), prefilled
    want = kvo_generate(args.kvo_generate, args.model, ["--chat", "--prompt", question], 16)
    assert r.choices[0].message.content == want, (r.choices[0].message.content, want)
    print(f"prefix reuse: {cached} of {r.usage.prompt_tokens} prompt tokens reused; "
          "kvo-generate's answer")

    # The slot holding the document is busy with a long answer: the next question about it
    # copies that slot's rows into a free one. Neither answer changes.
    long_q = document + "\n\nSummarise the conditions of redistribution."
    body = {"messages": [{"role": "user", "content": long_q}], "max_tokens": 160,
            "ignore_eos": True, "temperature": 0}
    held = []
    t = threading.Thread(target=lambda: held.append(server.post("/v1/chat/completions", body)))
    t.start()
    wait_for(lambda: server.metrics()["kvo_decode_steps_total"] > after["kvo_decode_steps_total"]
             and server.health()["slots_in_use"] == 1)
    copies = server.metrics()["kvo_prefix_copies_total"]
    other_q = document + "\n\nMay I charge a fee for support?"
    r = chat(server, other_q, max_tokens=16)
    assert r.usage.prompt_tokens_details.cached_tokens > 1000, r.usage
    assert server.metrics()["kvo_prefix_copies_total"] == copies + 1
    assert server.health()["slots_in_use"] == 1, "the long answer still runs"
    want = kvo_generate(args.kvo_generate, args.model, ["--chat", "--prompt", other_q], 16)
    assert r.choices[0].message.content == want, (r.choices[0].message.content, want)
    t.join()
    status, text = held[0]
    assert status == 200, text
    want = kvo_generate(args.kvo_generate, args.model,
                        ["--chat", "--ignore-eos", "--prompt", long_q], 160)
    assert json.loads(text)["choices"][0]["message"]["content"] == want
    print("a prefix held by a running request: copied into a free slot; both answers unchanged")


def check_interleaved(server, args):
    """A long prompt is prefilled 256 tokens at a time between the steps of a running request;
    both answers are kvo-generate's."""
    running_q = "Count from one to one hundred."
    body = {"messages": [{"role": "user", "content": running_q}], "max_tokens": 96,
            "ignore_eos": True, "temperature": 0}
    held = []
    t = threading.Thread(target=lambda: held.append(server.post("/v1/chat/completions", body)))
    before = server.metrics()
    t.start()
    wait_for(lambda: server.metrics()["kvo_decode_steps_total"] > before["kvo_decode_steps_total"])
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        long_q = f.read()[:6000] + "\n\nWhat is this license for?"
    r = chat(server, long_q, max_tokens=16)
    steps_during = server.metrics()["kvo_decode_steps_total"]
    t.join()
    after = server.metrics()
    prefilled = r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens
    assert prefilled > 1000, r.usage
    pieces = after["kvo_prefill_pieces_total"] - before["kvo_prefill_pieces_total"]
    assert pieces >= 1 + (prefilled + 255) // 256, pieces  # the running one's, and the long one's
    assert steps_during < after["kvo_decode_steps_total"], "the running request went on after"
    want = kvo_generate(args.kvo_generate, args.model, ["--chat", "--prompt", long_q], 16)
    assert r.choices[0].message.content == want, (r.choices[0].message.content, want)
    want = kvo_generate(args.kvo_generate, args.model,
                        ["--chat", "--ignore-eos", "--prompt", running_q], 96)
    assert json.loads(held[0][1])["choices"][0]["message"]["content"] == want, held
    print(f"a long prompt prefilled in {int(pieces) - 1} pieces between a running request's steps; "
          "both answers kvo-generate's")


def check_busy(server):
    body = {"messages": [{"role": "user", "content": "Count to one hundred."}],
            "max_tokens": 256, "ignore_eos": True, "temperature": 0}
    results = []

    def hold():
        results.append(server.post("/v1/chat/completions", body))

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads[:2]:
        t.start()
    wait_for(lambda: server.health()["slots_in_use"] == 2)
    for t in threads[2:]:
        t.start()
    wait_for(lambda: server.health()["queued"] == 2)
    status, text = server.post("/v1/chat/completions", body)
    assert status == 503, (status, text)
    assert "slots are busy" in json.loads(text)["error"]["message"], text
    for t in threads:
        t.join()
    assert [s for s, _ in results] == [200] * 4, results
    assert all(json.loads(t)["usage"]["completion_tokens"] == 256 for _, t in results)
    print("every slot busy and the queue full: 503 with a reason; the rest answered")


def wait_for(condition, seconds=120):
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


def raw(server, data, read=True):
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def check_hostile(server):
    ok = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    cases = [
        ("malformed JSON", b'{"messages": [', 400, "not JSON"),
        ("not an object", b"[1, 2]", 400, "JSON object"),
        ("not UTF-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),
        ("truncated", json.dumps(ok).encode()[:-5], 400, "not JSON"),
        ("wrong type", {**ok, "max_tokens": "ten"}, 400, "max_tokens"),
        ("negative max_tokens", {**ok, "max_tokens": -1}, 400, "max_tokens"),
        ("huge max_tokens", {**ok, "max_tokens": 10 ** 12}, 400, "max_tokens"),
        ("float max_tokens", {**ok, "max_tokens": 2.5}, 400, "max_tokens"),
        ("unknown role", {**ok, "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
        ("no messages", {**ok, "messages": []}, 400, "messages"),
        ("content of numbers", {**ok, "messages": [{"role": "user", "content": 5}]}, 400,
         "content"),
        ("temperature out of range", {**ok, "temperature": 7}, 400, "temperature"),
        ("top_p zero", {**ok, "top_p": 0}, 400, "top_p"),
        ("stop of numbers", {**ok, "stop": [1]}, 400, "stop"),
        ("n of 2", {**ok, "n": 2}, 400, "'n'"),
        ("prompt too long", {**ok, "messages": [{"role": "user", "content": "word " * 5000}]},
         400, "at most"),
        ("huge body", b"{" + b" " * (2 << 20) + b"}", 413, "--max-body"),
        ("unknown fields", {**ok, "frobnicate": {"a": [1]}, "user": "me"}, 200, None),
    ]
    for name, body, status, words in cases:
        got, text = server.post("/v1/chat/completions", body)
        assert got == status, (name, got, text)
        if words:
            message = json.loads(text)["error"]["message"]
            assert words in message, (name, message)
    for key in ("wrong", None):
        got, text = server.post("/v1/chat/completions", ok, key=key)
        assert got == 401 and "API key" in text, (key, got, text)
    assert server.get("/nowhere")[0] == 404
    # A client that sends half a request and nothing more does not hold up the others.
    slow = socket.create_connection(("127.0.0.1", server.port))
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n")
    got, _ = server.post("/v1/chat/completions", ok)
    assert got == 200
    slow.close()
    # A client that asks for a long stream and reads none of it does not hold up the others, and
    # its slot is freed once the answer is written (or the writes time out).
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story."}],
                       "max_tokens": 256, "ignore_eos": True, "stream": True}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
               KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: " +
               str(len(body)).encode() + b"\r\n\r\n" + body)
    deaf = socket.create_connection(("127.0.0.1", server.port))
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    deaf.sendall(request)
    wait_for(lambda: server.health()["slots_in_use"] == 1)
    got, _ = server.post("/v1/chat/completions", ok)
    assert got == 200
    wait_for(lambda: server.health()["slots_in_use"] == 0)
    deaf.close()
    # A client that goes away mid-stream: its request is cancelled and its slot freed.
    before = server.metrics()["kvo_requests_cancelled_total"]
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(request)
    seen = b""
    while b"data:" not in seen:
        chunk = s.recv(4096)
        assert chunk, seen
        seen += chunk
    s.close()
    wait_for(lambda: server.metrics()["kvo_requests_cancelled_total"] > before)
    wait_for(lambda: server.health()["slots_in_use"] == 0)
    got, text = server.post("/v1/chat/completions", ok)
    assert got == 200, text
    print(f"hostile requests: {len(cases) + 6} kinds, each its status; the server serves on")


def check_sigterm(server):
    results = []
    body = {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 64,
            "ignore_eos": True, "temperature": 0}
    threads = [threading.Thread(
        target=lambda: results.append(server.post("/v1/chat/completions", body)))
        for _ in range(3)]
    for t in threads[:2]:
        t.start()
    wait_for(lambda: server.health()["slots_in_use"] == 2)
    threads[2].start()
    wait_for(lambda: server.health()["queued"] == 1)
    assert server.stop() == 0, server.log
    for t in threads:
        t.join()
    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 200, 503], results
    for status, text in results:
        if status == 200:
            assert json.loads(text)["usage"]["completion_tokens"] == 64
        else:
            assert "shutting down" in json.loads(text)["error"]["message"], text
    print("SIGTERM: the running requests completed, the waiting one got 503, exit status 0")


def check_contexts(args):
    with tempfile.TemporaryDirectory() as contexts:
        with open(DOCUMENT, encoding="utf-8") as f:
            document = f.read()[:6000]
        server = Server(args.kvo_serve, args.model, "--contexts", contexts)
        chat(server, document + "\n\nWhat is this document?", max_tokens=8)
        assert server.stop() == 0, server.log
        assert os.path.getsize(os.path.join(contexts, "contexts.kvo")) > 0
        assert any("saved 2 slots" in line for line in server.log), server.log
        server = Server(args.kvo_serve, args.model, "--contexts", contexts)
        question = document + "\n\nWhat does the license say about trademarks?"
        r = chat(server, question, max_tokens=16)
        assert r.usage.prompt_tokens_details.cached_tokens > 1000, r.usage
        want = kvo_generate(args.kvo_generate, args.model, ["--chat", "--prompt", question], 16)
        assert r.choices[0].message.content == want, (r.choices[0].message.content, want)
        assert server.stop() == 0, server.log
        # Another slot count (or model, or max_seq) is refused, and the file kept as it was.
        before = open(os.path.join(contexts, "contexts.kvo"), "rb").read()
        run = subprocess.run([args.kvo_serve, "--model", args.model, *MODEL_ARGS, "--slots", "3",
                              "--max-seq", "4096", "--port", str(free_port()), "--contexts",
                              contexts], capture_output=True, text=True, timeout=300)
        assert run.returncode == 2 and "cannot be restored here" in run.stderr, run.stderr
        assert open(os.path.join(contexts, "contexts.kvo"), "rb").read() == before
    print("--contexts: the slots' rows survive a restart (prefix reused, kvo-generate's answer); "
          "another slot count is refused, the file kept")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvo-serve", required=True)
    p.add_argument("--kvo-generate", required=True)
    p.add_argument("--model", required=True)
    args = p.parse_args()
    server = Server(args.kvo_serve, args.model)
    try:
        check_equals_kvo_generate(server, args)
        check_two_at_once(server)
        check_prefix_reuse(server, args)
        check_interleaved(server, args)
        check_busy(server)
        check_hostile(server)
        assert server.health()["slots_in_use"] == 0
        check_sigterm(server)
    finally:
        if server.process.poll() is None:
            server.process.kill()
    check_contexts(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
