"""Running the server: with uvicorn in this process (`serve`, `retriever serve`), in a background thread
(`serving_in_thread`: tests, page screenshots, embedding it in another program), or distributed on Ray Serve
(`ray_application`, `serve_on_ray`: `retriever serve --engine ray`)."""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi import FastAPI

from retriever.errors import RetrieverError, param
from retriever.serve.access import AccessPolicy
from retriever.serve.app import create_app
from retriever.serve.batcher import MAX_BATCH_QUERIES
from retriever.serve.shards import RayShards, ShardServer
from retriever.versions.home import resolve_index_dir

log = logging.getLogger("retriever.serve")


@contextmanager
def serving_in_thread(app: FastAPI, timeout: float = 60.0) -> Iterator[str]:
    """Run APP with uvicorn on a free 127.0.0.1 port in a background thread (tests, page screenshots, embedding
    in another program); yields the base URL and stops the server on exit."""
    import uvicorn

    from retriever.serve.http_protocol import BoundedHttpProtocol

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=BoundedHttpProtocol))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RetrieverError("the server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()


def ray_application(index_dir: str | Path | None, shards: int, replicas: int = 1, device: str = "cpu",
                    runtime: str = "auto", access: AccessPolicy | None = None, max_batch: int = MAX_BATCH_QUERIES,
                    cpus_per_replica: float = 0.5):
    """The distributed server as a Ray Serve application (`retriever.serve.shards`): SHARDS shard deployments of REPLICAS
    replicas each, and the front (this module's app, one replica) whose vectors the shards search."""
    serve = import_serve()
    index_dir = str(resolve_index_dir(index_dir))
    if shards < 1:
        raise RetrieverError(f"{param('shards')} must be at least 1 (got {shards})", parameter="shards")
    if replicas < 1:
        raise RetrieverError(f"{param('replicas')} must be at least 1 (got {replicas})", parameter="replicas")
    shard_deployments = [
        serve.deployment(ShardServer, name=f"shard-{number}", num_replicas=replicas,
                         ray_actor_options={"num_cpus": cpus_per_replica}).bind(index_dir, number, shards, device)
        for number in range(shards)]

    @serve.deployment(name="front", num_replicas=1, ray_actor_options={"num_cpus": cpus_per_replica})
    @serve.ingress()
    class Front:
        def __init__(self, *handles):
            self.api = create_app(index_dir, device=device, preload=True, max_batch=max_batch, runtime=runtime,
                                  access=access, remote=RayShards(handles))

        def __serve_build_asgi_app__(self):
            return self.api

    return Front.bind(*shard_deployments)


def import_serve():
    """Ray Serve, or one line saying how to get it (an optional extra)."""
    try:
        from ray import serve
    except ImportError:
        raise RetrieverError(f"{param('engine', 'ray')} needs Ray Serve: pip install 'retriever[ray]' "
                             "(or 'ray[serve]')") from None
    return serve


def serve(index_dir: str | Path | None = None, host: str = "127.0.0.1", port: int = 8000, device: str = "auto",
          max_batch: int = MAX_BATCH_QUERIES, access_log: bool = False, runtime: str = "auto",
          access: AccessPolicy | None = None, allow_without_key: bool = False, engine: str = "local",
          shards: int = 2, replicas: int = 1, ray_address: str | None = None) -> None:
    """Run the server until interrupted (the CLI's `retriever serve`). ACCESS: the Host names answered and the
    keys (default: `serving_hosts(host)`, no key); listening beyond loopback without a key is refused unless
    ALLOW_WITHOUT_KEY. ENGINE "ray": the distributed server (`ray_application`) on the Ray cluster at RAY_ADDRESS
    (default: a local one on 127.0.0.1), SHARDS shards of REPLICAS replicas each."""
    import uvicorn

    from retriever.serve.access import check_exposure, serving_hosts
    from retriever.serve.http_protocol import BoundedHttpProtocol

    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    access = access or AccessPolicy.create(serving_hosts(host))
    check_exposure(host, access, allow_without_key)
    if engine == "ray":
        serve_on_ray(index_dir, host, port, device, max_batch, runtime, access, shards, replicas, ray_address)
        return
    if engine != "local":
        raise RetrieverError(f"unknown {param('engine')} {engine!r}; known: local, ray", parameter="engine")
    if str(device).lower().startswith("cuda"):  # refused here, not index by index once every index is opened
        from retriever.encode.device import resolve_device

        resolve_device(device)
    listening = listening_socket(host, port)  # before any index opens: a port in use is said at once
    try:
        app = create_app(index_dir, device=device, preload=True, max_batch=max_batch, runtime=runtime, access=access)
        config = uvicorn.Config(app, host=host, port=port, log_level="info", access_log=access_log,
                                http=BoundedHttpProtocol)
        _run(config, listening)
    finally:
        listening.close()


def _run(config, listening: socket.socket) -> None:
    """uvicorn's server on LISTENING, saying where it listens once the indexes are open (uvicorn says so only for a
    socket it binds itself)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                host, port = listening.getsockname()[:2]
                logging.getLogger("uvicorn.error").info(
                    "listening on http://%s:%d (Ctrl-C stops)", f"[{host}]" if ":" in host else host, port)

    try:
        Server(config).run(sockets=[listening])
    except KeyboardInterrupt:  # Ctrl-C: uvicorn shut down cleanly, then raised it again; `uvicorn.run` swallows it
        pass


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to HOST:PORT for the server (as uvicorn binds one), or one line saying why there is none."""
    listening = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
        listening.listen(2048)  # listening now: a second server's bind of the same port fails (SO_REUSEADDR lets
        # two sockets bind one address while neither listens)
    except OSError as error:
        listening.close()
        if error.errno == errno.EADDRINUSE:
            raise RetrieverError(f"port {port} on {host} is in use (another server?): choose another with "
                                 f"{param('port')}", parameter="port") from None
        raise RetrieverError(f"cannot listen on {host}:{port} ({error.strerror or error})", parameter="port") from None
    listening.set_inheritable(True)
    return listening


def serve_on_ray(index_dir: str | Path | None, host: str, port: int, device: str, max_batch: int, runtime: str,
                 access: AccessPolicy, shards: int, replicas: int, ray_address: str | None,
                 until: threading.Event | None = None) -> None:
    """`ray_application` on Ray Serve, HTTP on HOST:PORT, until interrupted (or UNTIL is set)."""
    from retriever.engines.ray_build import ray_cluster

    serve = import_serve()
    application = ray_application(index_dir, shards, replicas, "cpu" if device == "auto" else device, runtime,
                                  access, max_batch)
    with ray_cluster(ray_address):
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(application, name="retriever", route_prefix="/")
            log.info("serving on http://%s:%d with %d shards x %d replicas (Ray Serve)", host, port, shards, replicas)
            (until or threading.Event()).wait()
        except KeyboardInterrupt:
            pass
        finally:
            serve.shutdown()
