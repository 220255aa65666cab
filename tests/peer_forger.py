"""A forger on the test LAN (tests/test_peers.py): a server that does not hold LEMONADE_PEER_KEY and
tries to be taken for a peer anyway, in the strongest way open to it.

It announces itself with forged discovery beacons (as a Lemonade server would), and when a member
challenges it (`POST /peers/challenge`) it passes the challenge on to a real member (`--relay`) and
answers with that member's answer, proof included: a relay, the one thing a forger can do that a
plain wrong answer cannot. Every request it receives is written to `--log` (method, path, headers,
body), so the test can show what reached it: the challenges and nothing else, never the key.

Run as `python tests/peer_forger.py --host ADDR --port N --relay URL --log FILE --beacon-port N
--broadcast ADDR`; standard library only.
"""

from __future__ import annotations

import argparse
import http.server
import json
import socket
import threading
import time
import urllib.request


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--relay", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--beacon-port", type=int, required=True)
    parser.add_argument("--broadcast", required=True)
    args = parser.parse_args()
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            return None

        def _record(self) -> bytes:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            entry = {"method": self.command, "path": self.path, "headers": dict(self.headers.items()),
                     "body": body.decode("latin-1")}
            with lock, open(args.log, "a") as out:
                out.write(json.dumps(entry) + "\n")
            return body

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._record()
            self._reply(404, b'{"error": {"message": "not found"}}')

        def do_POST(self) -> None:  # noqa: N802
            body = self._record()
            if self.path in ("/peers/challenge", "/peers/session"):  # passed on to a real member
                request = urllib.request.Request(args.relay + self.path, data=body,
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=5) as resp:
                        self._reply(resp.status, resp.read())
                except OSError as exc:
                    self._reply(502, json.dumps({"error": {"message": str(exc)}}).encode())
                return
            self._reply(404, b'{"error": {"message": "not found"}}')

    server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    beacon = json.dumps({"service": "lemonade", "hostname": "forger",
                         "url": f"http://{args.host}:{args.port}/api/v1/"}).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    while True:
        sock.sendto(beacon, (args.broadcast, args.beacon_port))
        time.sleep(1.0)


if __name__ == "__main__":
    main()
