"""A stand-in for the Telegram Bot API on 127.0.0.1: records sendMessage calls and serves getUpdates.

For tests, the webhook benchmark and offline demos (point WORKFLOWS["TELEGRAM_API_BASE"] at `url`).
It is a real HTTP server (stdlib, one thread per request) that answers like the Bot API:
{"ok": true, "result": ...}. Any token is accepted; `calls` records (token, method, payload).
`fail_sends(n)` makes the next n sendMessage calls fail as Telegram does when it is unwell;
`go_down()` and `come_back()` make it refuse connections for a while, then answer again on the same port.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeBotAPI:
    def __init__(self):
        self.calls = []
        self.sent = []  # the sendMessage payloads accepted
        self.updates = []
        self._lock = threading.Lock()
        self._message_id = 0
        self._failures = []  # (status, description) answers for the next sendMessage calls
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm and
            # the client's delayed ACK would hold every answer back by ~40 ms on a kept-alive connection.
            disable_nagle_algorithm = True

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    payload = json.loads(raw or b"{}")
                except ValueError:
                    return self._answer(400, {"ok": False, "description": "Bad Request: invalid JSON"})
                parts = self.path.strip("/").split("/")
                if len(parts) != 2 or not parts[0].startswith("bot"):
                    return self._answer(404, {"ok": False, "description": "Not Found"})
                token, method = parts[0][3:], parts[1]
                status, body = fake._handle(token, method, payload)
                self._answer(status, body)

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet: tests and benchmarks print their own output
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                # A client that died mid-request (a killed worker) is part of what is tested: no traceback.
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self._server_class, self._handler = Server, Handler
        self._listen(0)
        self._address = self._server.server_address[:2]
        self._up = False

    def _listen(self, port):
        self._server = self._server_class(("127.0.0.1", port), self._handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-bot-api", daemon=True)

    @property
    def url(self):
        host, port = self._address
        return f"http://{host}:{port}"

    def start(self):
        self._thread.start()
        self._up = True
        return self

    def stop(self):
        if self._up:
            self._up = False
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)

    def go_down(self):
        """Stop listening: connections to `url` are refused, as when the Bot API cannot be reached."""
        self.stop()

    def come_back(self):
        """Listen again on the same address (what was recorded so far is kept)."""
        if not self._up:
            self._listen(self._address[1])
            self.start()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def sent_messages(self, chat_id=None):
        """The sendMessage payloads accepted so far (for one chat, if given)."""
        with self._lock:
            sent = list(self.sent)
        return [p for p in sent if chat_id is None or p.get("chat_id") == chat_id]

    def sent_count(self):
        with self._lock:
            return len(self.sent)

    def fail_sends(self, count, status=502, description="Bad Gateway"):
        """Answer the next `count` sendMessage calls with an error (not counted by sent_messages)."""
        with self._lock:
            self._failures.extend([(status, description)] * count)

    def queue_update(self, update):
        with self._lock:
            self.updates.append(update)

    def _handle(self, token, method, payload):
        with self._lock:
            self.calls.append((token, method, payload))
            if method == "sendMessage":
                if self._failures:
                    status, description = self._failures.pop(0)
                    return status, {"ok": False, "error_code": status, "description": description}
                if "chat_id" not in payload or not payload.get("text"):
                    return 400, {"ok": False, "description": "Bad Request: chat_id and text are required"}
                self._message_id += 1
                self.sent.append(payload)
                return 200, {
                    "ok": True,
                    "result": {
                        "message_id": self._message_id,
                        "chat": {"id": payload["chat_id"]},
                        "text": payload["text"],
                    },
                }
            if method == "getUpdates":
                offset = payload.get("offset")
                if offset is not None:
                    self.updates = [u for u in self.updates if u["update_id"] >= offset]
                return 200, {"ok": True, "result": list(self.updates)}
            if method == "answerCallbackQuery":
                return 200, {"ok": True, "result": True}
        return 404, {"ok": False, "description": f"Not Found: method {method}"}


def telegram_update(update_id, user_id, text, *, first_name="Ada", chat_id=None, chat_type="private", kind="message"):
    """A Bot API update as Telegram sends it."""
    chat_id = user_id if chat_id is None else chat_id
    message = {
        "message_id": update_id,
        "from": {"id": user_id, "is_bot": False, "first_name": first_name},
        "chat": {"id": chat_id, "type": chat_type},
        "date": 1700000000,
        "text": text,
    }
    if kind == "callback_query":
        return {
            "update_id": update_id,
            "callback_query": {"id": f"cb{update_id}", "from": message["from"], "message": message, "data": text},
        }
    return {"update_id": update_id, kind: message}
