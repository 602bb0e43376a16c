"""The cluster network, as far as the apiserver sees it.

A real kube-apiserver reaches a webhook Service by dialing the Service's ClusterIP. Here no
kube-proxy routes ClusterIPs, and EndpointSlices may not name loopback addresses, so the
apiserver is started with an EgressSelectorConfiguration whose `cluster` egress goes through
this HTTP CONNECT proxy on a unix socket (the protocol and transport of konnectivity's proxy
server; HTTPConnect over plain TCP panics in kube-apiserver 1.37.2, getTLSConfig(nil) in
k8s.io/apiserver/pkg/server/egressselector/egress_selector.go). The proxy forwards the
addresses the tests expose to ports on 127.0.0.1 (or to the real node's address, across the veth
of its network namespace), dials the addresses of a routed subnet as they are (the real node's
Service and Pod subnets, which the host routes to the node, where its kube-proxy and bridge take
them), and refuses every other; it records what was dialed, so a test can show that the apiserver
resolved the Service itself.
"""

from __future__ import annotations

import ipaddress
import socket
import socketserver
import threading
from pathlib import Path


class ClusterNetwork:
    def __init__(self, socket_path: Path) -> None:
        self._routes: dict[str, tuple[str, int]] = {}
        self._subnets: list[ipaddress.IPv4Network] = []
        self._open: dict[str, set[socket.socket]] = {}
        self._lock = threading.Lock()
        self.dialed: list[str] = []
        network = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                network._tunnel(self.request)

        self.socket_path = socket_path
        self._server = socketserver.ThreadingUnixStreamServer(str(socket_path), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="cluster-network", daemon=True)
        self._thread.start()

    def expose(self, address: str, local_port: int, *, host: str = "127.0.0.1") -> None:
        """Connections to `address` ("host:port", as the apiserver dials it) reach host:local_port."""
        with self._lock:
            self._routes[address] = (host, local_port)

    def route(self, subnet: str) -> None:
        """Connections to any address of `subnet` not exposed otherwise are dialed as they are."""
        with self._lock:
            self._subnets.append(ipaddress.ip_network(subnet))

    def unroute(self, subnet: str) -> None:
        with self._lock:
            self._subnets = [s for s in self._subnets if s != ipaddress.ip_network(subnet)]

    def _target(self, address: str) -> tuple[str, int] | None:
        if address in self._routes:
            return self._routes[address]
        host, _, port = address.rpartition(":")
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return None
        if port.isdigit() and any(ip in subnet for subnet in self._subnets):
            return (str(ip), int(port))
        return None

    def withdraw(self, address: str) -> None:
        """No new connection to `address`, and the open ones cut, as when its endpoints go."""
        with self._lock:
            self._routes.pop(address, None)
            cut = self._open.pop(address, set())
        for sock in cut:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _tunnel(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk or len(head) > 16384:
                return
            head += chunk
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(request_line) != 3 or request_line[0] != "CONNECT":
            client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            return
        address = request_line[1]
        with self._lock:
            self.dialed.append(address)
            target = self._target(address)
        if target is None:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            return
        try:
            upstream = socket.create_connection(target, timeout=10)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            return
        upstream.settimeout(None)
        no_delay(upstream)
        with self._lock:
            self._open.setdefault(address, set()).add(upstream)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            relay(client, upstream)
        finally:
            with self._lock:
                self._open.get(address, set()).discard(upstream)


class TcpRelay:
    """Listens on `listen` (host, port 0 for any) and joins each connection to `target`: how the
    real node, whose namespace has no loopback route to the host, reaches the apiserver."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    upstream = socket.create_connection(target, timeout=10)
                except OSError:
                    return
                upstream.settimeout(None)
                no_delay(self.request, upstream)
                relay(self.request, upstream)

        self._server = socketserver.ThreadingTCPServer(listen, Handler)
        self._server.daemon_threads = True
        self.address: tuple[str, int] = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="tcp-relay", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def no_delay(*sockets: socket.socket) -> None:
    """Nagle off, as Go (the apiserver, konnectivity) sets it on every TCP socket: a relay writes
    a request in pieces, and Nagle holds the second until the first is acked, which the peer
    delays by up to 40 ms."""
    for sock in sockets:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def relay(client: socket.socket, upstream: socket.socket) -> None:
    """Copies both ways until either side closes."""
    pump = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    pump.start()
    _pump(client, upstream)
    pump.join()
    upstream.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (sink, source):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
