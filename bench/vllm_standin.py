"""A loopback stand-in for vLLM's runtime-LoRA API, for a trainer on a machine without vLLM
(``bench/trainer_whole.py`` on the GPU machine ``bench/gpu.sh`` runs on).

It answers what the trainer calls (``serving/adapters.py``), in vLLM's shapes:

* ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}``: 200, the name now listed with
  that path; 400 where the path holds no ``adapter_config.json`` or the name is loaded already
  (vLLM's "has already been loaded", which the trainer reads);
* ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``: 200, or 404 for a name not loaded;
* ``GET /v1/models``: the base model, then each loaded adapter with its path as ``root``;
* ``POST /v1/completions`` and ``/v1/chat/completions``: a one-token answer for the base model
  or a loaded adapter (the trainer's check that a version answers), 404 for any other model.

Nothing is generated and no weights are read: what a publish costs here is the trainer's own
side of it (its HTTP calls: the load, the check), not vLLM's load. Standard library only.

    with VLLMStandIn("qwen2.5-1.5b", "/models/qwen") as vllm:   # on 127.0.0.1, a free port
        settings = Settings.load({}, upstream=vllm.url)
    python3 bench/vllm_standin.py --base-model tiny             # serve until Ctrl-C
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class VLLMStandIn:
    def __init__(self, base_model: str, root: str | None = None, *, max_model_len: int = 32768) -> None:
        self.base_model, self.root, self.max_model_len = base_model, root or base_model, max_model_len
        self.adapters: dict[str, str] = {}  # name -> path, in the order loaded
        self.calls: Counter[str] = Counter()  # what was asked, by route and outcome
        self.lock = threading.Lock()
        self.created = int(time.time())
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept alive, as vLLM's server does
            # Headers and body in one write, sent at once: without these, Nagle's algorithm holds
            # the body back for the client's delayed ACK, 40 ms an answer.
            wbufsize = -1
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.answer(*standin.get(self.path))

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = None
                self.answer(*standin.post(self.path, body if isinstance(body, dict) else {}))

            def answer(self, status: int, payload: Any) -> None:
                text = payload if isinstance(payload, str) else json.dumps(payload)
                data = text.encode()
                self.send_response(status)
                self.send_header("content-type", "text/plain; charset=utf-8" if isinstance(payload, str) else "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="vllm-standin", daemon=True)

    def __enter__(self) -> VLLMStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()

    # ---- the routes ------------------------------------------------------------------------

    def get(self, path: str) -> tuple[int, Any]:
        if path.split("?")[0] == "/v1/models":
            self.calls["models"] += 1
            with self.lock:
                adapters = list(self.adapters.items())
            base: dict[str, Any] = {"id": self.base_model, "root": self.root, "parent": None}
            entries = [base, *({"id": name, "root": root, "parent": self.base_model} for name, root in adapters)]
            data = [{"object": "model", "created": self.created, "owned_by": "vllm", "max_model_len": self.max_model_len, **e} for e in entries]
            return 200, {"object": "list", "data": data}
        if path == "/health":
            return 200, ""
        return 404, error(f"no route {path}", "NotFoundError", 404)

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        route = path.split("?")[0]
        if route == "/v1/load_lora_adapter":
            return self.load(str(body.get("lora_name") or ""), str(body.get("lora_path") or ""))
        if route == "/v1/unload_lora_adapter":
            name = str(body.get("lora_name") or "")
            with self.lock:
                found = self.adapters.pop(name, None)
            self.calls["unload" if found is not None else "unload refused"] += 1
            if found is None:
                return 404, error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        if route in ("/v1/completions", "/v1/chat/completions"):
            return self.complete(route, body)
        return 404, error(f"no route {path}", "NotFoundError", 404)

    def load(self, name: str, path: str) -> tuple[int, Any]:
        if not name or not path:
            self.calls["load refused"] += 1
            return 400, error("lora_name and lora_path are required", "BadRequestError", 400)
        with self.lock:
            if name in self.adapters:
                self.calls["load refused"] += 1
                return 400, error(f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput", 400)
            if not (Path(path) / "adapter_config.json").is_file():
                self.calls["load refused"] += 1
                return 400, error(f"No adapter found for {path}", "BadRequestError", 400)
            self.adapters[name] = path
        self.calls["load"] += 1
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def complete(self, route: str, body: dict[str, Any]) -> tuple[int, Any]:
        model = body.get("model")
        with self.lock:
            known = model == self.base_model or model in self.adapters
        if not known:
            self.calls["answer refused"] += 1
            return 404, error(f"The model `{model}` does not exist.", "NotFoundError", 404)
        self.calls["answer"] += 1
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        if route == "/v1/completions":
            choice: dict[str, Any] = {"index": 0, "text": " ok", "logprobs": None, "finish_reason": "length", "stop_reason": None}
            return 200, {"id": "cmpl-standin", "object": "text_completion", "created": int(time.time()), "model": model, "choices": [choice], "usage": usage}
        message = {"role": "assistant", "content": "ok", "tool_calls": []}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        return 200, {"id": "chatcmpl-standin", "object": "chat.completion", "created": int(time.time()), "model": model, "choices": [choice], "usage": usage}


def error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-model", default="base", help="the id /v1/models lists first and the checks may ask for")
    ap.add_argument("--root", help="its root (default: the id)")
    args = ap.parse_args()
    with VLLMStandIn(args.base_model, args.root) as vllm:
        print(vllm.url, flush=True)
        try:
            vllm.thread.join()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
