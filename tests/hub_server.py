"""A small Hugging Face Hub-compatible HTTP server for tests (standard library only).

It speaks the routes ``huggingface_hub`` uses for ``create_repo`` + ``create_commit`` /
``upload_folder`` (LFS transfer, ``HF_HUB_DISABLE_XET=1``) + ``repo_info`` / ``list_repo_tree``
/ ``hf_hub_download`` / ``snapshot_download`` (see docs/hub-test-server.md), keeps repos
in memory, and is driven over a real socket on 127.0.0.1 by the real client::

    server = HubServer().start()
    api = HfApi(endpoint=server.url, token=False)
    ...
    server.stop()

What it keeps
    Repos with git-like history: every commit has a 40-hex id (sha1 of its parent, message and
    file oids), refs (``main``, branches, ``refs/pr/N``). Regular files are stored as bytes with
    their git blob oid; LFS files as sha256-addressed blobs with their pointer oid. A new repo gets
    an initial commit holding ``.gitattributes``, as the Hub does.

Atomic commits
    A commit request is read and validated completely (every ``lfsFile`` must name an uploaded
    blob of the right size, every ``deletedFile`` an existing file) before anything changes, and
    is applied under one lock: it lands fully or not at all. An LFS upload whose body is cut off
    stores nothing.

Fault injection (``server.faults.append(Fault(...))`` or ``server.fault(...)``)
    - ``Fault("commit", status=500)``: answer that status on that route;
    - ``Fault("lfs-upload", drop_after=4096)``: read that many bytes of the body, then drop the
      connection without answering;
    - ``times=N`` limits a fault to its first N matches (None: every time);
    - ``server.require_token = "hf_..."``: /api and LFS-batch calls without that bearer token get
      401 ``Invalid credentials in Authorization header``;
    - ``server.forbid = True``: write calls (create, preupload, LFS batch, commit, branch) get 403;
    - ``Fault(..., echo_auth=True)``: the error body repeats the request's Authorization header
      (a careless server), to prove the client side never shows it;
    - ``Fault("repo-info", stall="answer")``: read the request, then never answer; ``stall="body"``:
      send the status line and headers (Content-Length 1000) and 10 bytes of body, then nothing.
      A stalled connection is held until ``clear_faults()`` or ``stop()``, then dropped.

Request bodies (``server.record_bodies = True``)
    ``server.bodies`` lists (route, bytes) for every request body read, to prove what never arrived.

Request log
    ``server.log`` lists every request as a :class:`Logged` (method, path, route, status). The
    Authorization header is never recorded, only whether one was sent.

Route names (for faults and the log): whoami, create, validate-yaml, preupload, commit, branch,
refs, commits, repo-info, tree, resolve, lfs-batch, lfs-upload, lfs-part, lfs-complete,
lfs-verify.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

GITATTRIBUTES = (
    b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
    b"*.pt filter=lfs diff=lfs merge=lfs -text\n"
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    b"*.model filter=lfs diff=lfs merge=lfs -text\n"
)
LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.model", "*.gz", "*.zip")
LFS_SIZE = 10 * 1024 * 1024  # the Hub sends files of 10 MB and more through LFS
DATE = "2026-01-01T00:00:00.000Z"


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class Entry:
    """One file in a commit: ``content`` for regular files, ``sha256`` for LFS ones."""

    path: str
    size: int
    oid: str  # git blob oid (of the pointer for LFS files)
    content: bytes | None = None
    sha256: str | None = None

    @property
    def is_lfs(self) -> bool:
        return self.sha256 is not None


@dataclass(frozen=True)
class Commit:
    id: str
    parent: str | None
    title: str
    message: str
    files: dict  # path -> Entry


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    commits: dict = field(default_factory=dict)  # id -> Commit
    refs: dict = field(default_factory=dict)  # "main", "dev", "refs/pr/1" -> commit id
    prs: int = 0

    def resolve(self, rev: str) -> Commit | None:
        if rev in self.refs:
            return self.commits[self.refs[rev]]
        if len(rev) >= 7 and all(c in "0123456789abcdef" for c in rev):
            found = [c for cid, c in self.commits.items() if cid.startswith(rev)]
            if len(found) == 1:
                return found[0]
        return None

    def history(self, rev: str = "main") -> list[Commit]:
        """Commits reachable from ``rev``, newest first."""
        out, c = [], self.resolve(rev)
        while c is not None:
            out.append(c)
            c = self.commits.get(c.parent) if c.parent else None
        return out

    def files(self, rev: str = "main") -> dict:
        """path -> :class:`Entry` of every file at ``rev``."""
        c = self.resolve(rev)
        return {} if c is None else dict(c.files)


@dataclass
class Fault:
    route: str
    status: int | None = None
    drop_after: int | None = None
    times: int | None = None
    method: str | None = None
    headers: dict = field(default_factory=dict)
    body: dict | None = None
    echo_auth: bool = False
    stall: str | None = None  # "answer" | "body"
    hits: int = 0


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    route: str
    status: int | None  # None: the connection was dropped
    authorized: bool
    user_agent: str = ""


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra or {}


class _Dropped(Exception):
    pass


class HubState:
    def __init__(self):
        self.lock = threading.RLock()
        self.repos: dict[tuple[str, str], Repo] = {}
        self.blobs: dict[tuple[str, str], bytes] = {}  # (repo id, sha256) -> content: LFS storage per repo
        self.parts: dict[tuple[str, str, int], bytes] = {}  # multipart uploads in progress

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        r = self.repos.get((repo_type, repo_id))
        if r is None:
            raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return r

    def file_bytes(self, repo_id: str, entry: Entry) -> bytes:
        return self.blobs[(repo_id, entry.sha256)] if entry.is_lfs else entry.content  # type: ignore[index,return-value]

    def make_commit(self, repo: Repo, parent: Commit | None, title: str, message: str, files: dict) -> Commit:
        h = hashlib.sha1()
        h.update(json.dumps([parent.id if parent else None, title, message,
                             sorted((p, e.oid) for p, e in files.items())]).encode())
        if h.hexdigest() in repo.commits:  # same tree, same parent, same message: still a new commit
            h.update(str(len(repo.commits)).encode())
        c = Commit(h.hexdigest(), parent.id if parent else None, title, message, files)
        repo.commits[c.id] = c
        return c


def _regular(path: str, content: bytes) -> Entry:
    return Entry(path, len(content), git_blob_oid(content), content=content)


def _lfs(path: str, sha256: str, size: int) -> Entry:
    return Entry(path, size, git_blob_oid(lfs_pointer(sha256, size)), sha256=sha256)


class HubServer:
    """The server; ``start()`` binds 127.0.0.1 on a free port and serves in a thread."""

    def __init__(self, *, multipart_chunk: int | None = None):
        self.state = HubState()
        self.faults: list[Fault] = []
        self.log: list[Logged] = []
        self.require_token: str | None = None
        self.forbid = False
        self.multipart_chunk = multipart_chunk  # LFS files larger than this go multipart
        self.user = "tester"
        self.record_bodies = False
        self.bodies: list[tuple[str, bytes]] = []
        self.release = threading.Event()  # set: stalled requests give up and drop their connection
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> HubServer:
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ----------------------------------------------------------------- test helpers
    def fault(self, route: str, **kw) -> Fault:
        f = Fault(route, **kw)
        self.faults.append(f)
        return f

    def clear_faults(self) -> None:
        self.release.set()
        self.release = threading.Event()
        self.faults.clear()
        self.require_token = None
        self.forbid = False

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        return self.state.repo(repo_id, repo_type)

    def has_repo(self, repo_id: str, repo_type: str = "model") -> bool:
        return (repo_type, repo_id) in self.state.repos

    def commit_ids(self, repo_id: str) -> set[str]:
        """Every commit the repo holds (any ref): a failed push must leave this unchanged."""
        if not self.has_repo(repo_id):
            return set()
        with self.state.lock:
            return set(self.repo(repo_id).commits)

    def refs(self, repo_id: str) -> dict:
        with self.state.lock:
            return dict(self.repo(repo_id).refs) if self.has_repo(repo_id) else {}

    def read(self, repo_id: str, path: str, rev: str = "main") -> bytes:
        with self.state.lock:
            c = self.repo(repo_id).resolve(rev)
            assert c is not None, rev
            return self.state.file_bytes(repo_id, c.files[path])

    def paths(self, repo_id: str, rev: str = "main") -> set[str]:
        with self.state.lock:
            c = self.repo(repo_id).resolve(rev)
            return set(c.files) if c else set()

    def routes(self) -> list[str]:
        return [e.route for e in self.log]


# --------------------------------------------------------------------------- handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms stalls
    server_hub: HubServer

    def log_message(self, format, *args):  # noqa: A002 - keep test output clean
        pass

    # every verb goes through one dispatcher
    def do_GET(self):
        self._dispatch()

    def do_HEAD(self):
        self._dispatch()

    def do_POST(self):
        self._dispatch()

    def do_PUT(self):
        self._dispatch()

    def do_DELETE(self):
        self._dispatch()

    # ----------------------------------------------------------------- plumbing
    def _dispatch(self) -> None:
        hub = self.server_hub
        self._body_read = False  # one handler serves every request of a keep-alive connection
        split = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        self.segments = [s for s in split.path.split("/")]
        if self.segments and self.segments[0] == "":
            self.segments = self.segments[1:]
        route, handler, args = self._route()
        self.route_name = route
        auth = self.headers.get("Authorization")
        status: int | None = None
        try:
            fault = self._match_fault(route)
            if fault is not None and fault.drop_after is not None:
                self._read_body(limit=fault.drop_after)
                raise _Dropped()
            if fault is not None and fault.stall is not None:
                release = hub.release
                self._read_body()
                if fault.stall == "body":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b'{"id": "stal')
                    self.wfile.flush()
                release.wait(120)
                raise _Dropped()
            if fault is not None and fault.status is not None:
                self._read_body()
                body = dict(fault.body or {"error": f"injected {fault.status} on {route}"})
                if fault.echo_auth:
                    body["error"] = f"{body.get('error')} (request had Authorization: {auth})"
                    fault.headers = {**fault.headers, "X-Error-Message": f"bad header {auth}"}
                status = fault.status
                self._json(status, body, headers=fault.headers)
                return
            if handler is None:
                raise HubError(404, f"no route for {self.command} {split.path}")
            self._check_auth(route, auth)
            status = handler(*args)
        except _Dropped:
            status = None
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        except HubError as e:
            status = e.status
            headers = {"X-Error-Message": e.message}
            if e.code:
                headers["X-Error-Code"] = e.code
            self._json(e.status, {"error": e.message, **e.extra}, headers=headers)
        except (ConnectionError, OSError):
            status = None
            self.close_connection = True
        finally:
            with hub.state.lock:
                hub.log.append(Logged(self.command, split.path, route, status, auth is not None,
                                      self.headers.get("User-Agent") or ""))

    def _match_fault(self, route: str) -> Fault | None:
        hub = self.server_hub
        with hub.state.lock:
            for f in hub.faults:
                if f.route != route or (f.method and f.method != self.command):
                    continue
                if f.times is not None and f.hits >= f.times:
                    continue
                f.hits += 1
                return f
        return None

    def _check_auth(self, route: str, auth: str | None) -> None:
        hub = self.server_hub
        if route.startswith("lfs-") and route != "lfs-batch":
            return  # pre-signed storage URLs carry no token, as on the Hub
        if hub.require_token is not None and auth != f"Bearer {hub.require_token}":
            self._read_body()
            raise HubError(401, "Invalid credentials in Authorization header")
        if hub.forbid and route in ("create", "preupload", "lfs-batch", "commit", "branch"):
            self._read_body()
            ns = getattr(self, "repo_id", "") or ""
            raise HubError(403, f"You don't have the rights to write to {ns or 'this namespace'}")

    def _read_body(self, limit: int | None = None) -> bytes:
        if getattr(self, "_body_read", False):
            return b""
        self._body_read = True
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                line = self.rfile.readline()
                if not line:
                    raise _Dropped()
                n = int(line.split(b";")[0].strip(), 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    if self.server_hub.record_bodies:
                        with self.server_hub.state.lock:
                            self.server_hub.bodies.append((self.route_name, bytes(out)))
                    return bytes(out)
                if limit is not None and len(out) + n > limit:
                    out += self.rfile.read(max(0, limit - len(out)))
                    return bytes(out)
                chunk = self.rfile.read(n)
                if len(chunk) < n:
                    raise _Dropped()
                out += chunk
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        want = length if limit is None else min(limit, length)
        out = bytearray()
        while len(out) < want:
            chunk = self.rfile.read(min(1 << 20, want - len(out)))
            if not chunk:
                raise _Dropped()
            out += chunk
        if self.server_hub.record_bodies:
            with self.server_hub.state.lock:
                self.server_hub.bodies.append((self.route_name, bytes(out)))
        return bytes(out)

    def _json_body(self) -> dict:
        raw = self._read_body()
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            raise HubError(400, "body is not JSON") from None

    def _send(self, status: int, body: bytes, headers: dict | None = None, content_type="application/json") -> int:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return status

    def _json(self, status: int, obj, headers: dict | None = None) -> int:
        if not getattr(self, "_body_read", False) and self.command in ("POST", "PUT"):
            try:
                self._read_body()
            except _Dropped:
                pass
        return self._send(status, json.dumps(obj).encode(), headers)

    # ----------------------------------------------------------------- routing
    def _route(self):
        s, m = self.segments, self.command
        self.repo_id = None
        if s[:2] == ["api", "whoami-v2"] and m == "GET":
            return "whoami", self.h_whoami, ()
        if s[:3] == ["api", "repos", "create"] and m == "POST":
            return "create", self.h_create, ()
        if s[:2] == ["api", "validate-yaml"] and m == "POST":
            return "validate-yaml", self.h_validate_yaml, ()
        if len(s) >= 4 and s[0] == "api" and s[1] in ("models", "datasets", "spaces"):
            rtype = s[1][:-1]
            repo_id = f"{unquote(s[2])}/{unquote(s[3])}"
            self.repo_id = repo_id
            rest = s[4:]
            if not rest and m == "GET":
                return "repo-info", self.h_repo_info, (rtype, repo_id, "main")
            kind = rest[0] if rest else ""
            rev = unquote(rest[1]) if len(rest) > 1 else "main"
            if kind == "revision" and m == "GET":
                return "repo-info", self.h_repo_info, (rtype, repo_id, rev)
            if kind == "preupload" and m == "POST":
                return "preupload", self.h_preupload, (rtype, repo_id, rev)
            if kind == "commit" and m == "POST":
                return "commit", self.h_commit, (rtype, repo_id, rev)
            if kind == "branch" and m == "POST":
                return "branch", self.h_branch, (rtype, repo_id, rev)
            if kind == "refs" and m == "GET":
                return "refs", self.h_refs, (rtype, repo_id)
            if kind == "commits" and m == "GET":
                return "commits", self.h_commits, (rtype, repo_id, rev)
            if kind == "tree" and m == "GET":
                sub = "/".join(unquote(p) for p in rest[2:]).strip("/")
                return "tree", self.h_tree, (rtype, repo_id, rev, sub)
        if s and s[0] == "lfs-store" and len(s) >= 5:  # /lfs-store/{org}/{name}/{oid}/{action}
            self.repo_id = f"{unquote(s[1])}/{unquote(s[2])}"
            key, action = (self.repo_id, s[3]), s[4]
            if action == "upload" and m == "PUT":
                return "lfs-upload", self.h_lfs_put, (key,)
            if action == "part" and m == "PUT":
                return "lfs-part", self.h_lfs_part, (key, int(s[5]))
            if action == "complete" and m == "POST":
                return "lfs-complete", self.h_lfs_complete, (key,)
            if action == "verify" and m == "POST":
                return "lfs-verify", self.h_lfs_verify, (key,)
        # /{org}/{name}.git/info/lfs/objects/batch  (datasets/spaces carry a prefix)
        if len(s) >= 6 and s[-4:] == ["info", "lfs", "objects", "batch"] and m == "POST":
            lead = s[:-4]
            rtype = "model"
            if lead[0] in ("datasets", "spaces"):
                rtype, lead = lead[0][:-1], lead[1:]
            if len(lead) == 2 and lead[1].endswith(".git"):
                self.repo_id = f"{unquote(lead[0])}/{unquote(lead[1][:-4])}"
                return "lfs-batch", self.h_lfs_batch, (rtype, self.repo_id)
        # /{org}/{name}/resolve/{rev}/{path}
        if len(s) >= 5 and m in ("GET", "HEAD"):
            lead, rtype = s, "model"
            if lead[0] in ("datasets", "spaces"):
                rtype, lead = lead[0][:-1], lead[1:]
            if len(lead) >= 5 and lead[2] == "resolve":
                self.repo_id = f"{unquote(lead[0])}/{unquote(lead[1])}"
                path = "/".join(unquote(p) for p in lead[4:])
                return "resolve", self.h_resolve, (rtype, self.repo_id, unquote(lead[3]), path)
        return "unknown", None, ()

    # ----------------------------------------------------------------- handlers
    @property
    def hub(self) -> HubServer:
        return self.server_hub

    def h_whoami(self):
        return self._json(200, {"type": "user", "name": self.hub.user, "orgs": [],
                                "auth": {"accessToken": {"role": "write"}}})

    def h_create(self):
        body = self._json_body()
        name, org = body.get("name"), body.get("organization") or self.hub.user
        rtype = body.get("type") or "model"
        if not name:
            raise HubError(400, "name is required")
        repo_id = f"{org}/{name}"
        prefix = "" if rtype == "model" else f"{rtype}s/"
        url = f"{self.hub.url}/{prefix}{repo_id}"
        st = self.hub.state
        with st.lock:
            if (rtype, repo_id) in st.repos:
                raise HubError(409, "You already created this model repo", extra={"url": url})
            private = bool(body.get("private")) or body.get("visibility") == "private"
            repo = Repo(repo_id, rtype, private)
            init = st.make_commit(repo, None, "initial commit", "",
                                  {".gitattributes": _regular(".gitattributes", GITATTRIBUTES)})
            repo.refs["main"] = init.id
            st.repos[(rtype, repo_id)] = repo
        return self._json(200, {"url": url, "name": repo_id, "id": repo_id})

    def h_validate_yaml(self):
        body = self._json_body()
        if not isinstance(body.get("content"), str):
            raise HubError(400, "content is required")
        return self._json(200, {"errors": [], "warnings": []})

    def _commit_or_404(self, repo: Repo, rev: str) -> Commit:
        c = repo.resolve(rev)
        if c is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return c

    def h_repo_info(self, rtype, repo_id, rev):
        st = self.hub.state
        with st.lock:
            repo = st.repo(repo_id, rtype)
            c = self._commit_or_404(repo, rev)
            org = repo_id.split("/")[0]
            return self._json(200, {
                "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
                "author": org, "sha": c.id, "private": repo.private, "disabled": False, "gated": False,
                "downloads": 0, "likes": 0, "tags": [], "lastModified": DATE, "createdAt": DATE,
                "siblings": [{"rfilename": p} for p in sorted(c.files)],
            })

    def h_refs(self, rtype, repo_id):
        st = self.hub.state
        with st.lock:
            repo = st.repo(repo_id, rtype)
            branches = [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c}
                        for n, c in repo.refs.items() if not n.startswith("refs/")]
            prs = [{"name": n, "ref": n, "targetCommit": c}
                   for n, c in repo.refs.items() if n.startswith("refs/pr/")]
            return self._json(200, {"branches": branches, "converts": [], "tags": [], "pullRequests": prs})

    def h_commits(self, rtype, repo_id, rev):
        st = self.hub.state
        with st.lock:
            repo = st.repo(repo_id, rtype)
            self._commit_or_404(repo, rev)
            return self._json(200, [{"id": c.id, "title": c.title, "message": c.message, "authors": [],
                                     "date": DATE} for c in repo.history(rev)])

    def h_tree(self, rtype, repo_id, rev, sub):
        st = self.hub.state
        recursive = self.query.get("recursive", "").lower() in ("1", "true")
        with st.lock:
            repo = st.repo(repo_id, rtype)
            c = self._commit_or_404(repo, rev)
            out, folders = [], set()
            prefix = f"{sub}/" if sub else ""
            for path in sorted(c.files):
                if not path.startswith(prefix):
                    continue
                rel = path[len(prefix):]
                if "/" in rel and not recursive:
                    folders.add(prefix + rel.split("/")[0])
                    continue
                if recursive:
                    parts = rel.split("/")[:-1]
                    for i in range(1, len(parts) + 1):
                        folders.add(prefix + "/".join(parts[:i]))
                e = c.files[path]
                item = {"type": "file", "path": path, "size": e.size, "oid": e.oid}
                if e.is_lfs:
                    item["lfs"] = {"oid": e.sha256, "size": e.size,
                                   "pointerSize": len(lfs_pointer(e.sha256, e.size))}
                out.append(item)
            out += [{"type": "directory", "path": f, "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0}
                    for f in sorted(folders)]
            if sub and not out and sub not in c.files:
                raise HubError(404, f"{sub} does not exist", "EntryNotFound")
        return self._json(200, out)

    def h_preupload(self, rtype, repo_id, rev):
        body = self._json_body()
        st = self.hub.state
        with st.lock:
            repo = st.repo(repo_id, rtype)
            c = self._commit_or_404(repo, rev)
            files = []
            for f in body.get("files", []):
                path, size = f["path"], int(f["size"])
                sample = base64.b64decode(f.get("sample", ""))
                lfs = (size >= LFS_SIZE or b"\0" in sample
                       or any(fnmatch.fnmatch(path.rsplit("/", 1)[-1], p) for p in LFS_PATTERNS))
                existing = c.files.get(path)
                oid = None
                if existing is not None:
                    oid = existing.sha256 if existing.is_lfs else existing.oid
                files.append({"path": path, "uploadMode": "lfs" if lfs else "regular",
                              "shouldIgnore": False, "oid": oid})
        return self._json(200, {"files": files, "commitOid": c.id})

    def h_lfs_batch(self, rtype, repo_id):
        body = self._json_body()
        st = self.hub.state
        with st.lock:
            st.repo(repo_id, rtype)
        if body.get("operation") != "upload":
            raise HubError(400, "only uploads are supported")
        base = self.hub.url
        objects = []
        for o in body.get("objects", []):
            oid, size = o["oid"], int(o["size"])
            item = {"oid": oid, "size": size, "authenticated": True}
            with st.lock:
                stored = (repo_id, oid) in st.blobs
            if not stored:
                chunk = self.hub.multipart_chunk
                store = f"{base}/lfs-store/{repo_id}/{oid}"
                if chunk is not None and size > chunk:
                    n = -(-size // chunk)
                    header = {"chunk_size": str(chunk)}
                    header.update({f"{i:05d}": f"{store}/part/{i}" for i in range(1, n + 1)})
                    upload = {"href": f"{store}/complete", "header": header}
                else:
                    upload = {"href": f"{store}/upload"}
                item["actions"] = {"upload": upload, "verify": {"href": f"{store}/verify"}}
            objects.append(item)
        return self._json(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def _store(self, key: tuple[str, str], data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() != key[1]:
            raise HubError(400, f"content does not match oid {key[1]}")
        with self.hub.state.lock:
            self.hub.state.blobs[key] = data

    def h_lfs_put(self, key):
        self._store(key, self._read_body())
        return self._send(200, b"")

    def h_lfs_part(self, key, n):
        data = self._read_body()
        with self.hub.state.lock:
            self.hub.state.parts[(*key, n)] = data
        return self._send(200, b"", headers={"ETag": f'"{hashlib.md5(data).hexdigest()}"'})

    def h_lfs_complete(self, key):
        body = self._json_body()
        st = self.hub.state
        with st.lock:
            chunks = []
            for p in body.get("parts", []):
                data = st.parts.get((*key, int(p["partNumber"])))
                if data is None or p.get("etag") != f'"{hashlib.md5(data).hexdigest()}"':
                    raise HubError(400, f"part {p.get('partNumber')} missing or etag mismatch")
                chunks.append(data)
            for k in [k for k in st.parts if k[:2] == key]:
                del st.parts[k]
        self._store(key, b"".join(chunks))
        return self._json(200, {"ok": True})

    def h_lfs_verify(self, key):
        body = self._json_body()
        with self.hub.state.lock:
            data = self.hub.state.blobs.get(key)
        if data is None or len(data) != int(body.get("size", -1)):
            raise HubError(404, f"object {key[1]} not found")
        return self._json(200, {"ok": True})

    def h_branch(self, rtype, repo_id, branch):
        body = self._json_body()
        st = self.hub.state
        with st.lock:
            repo = st.repo(repo_id, rtype)
            if branch in repo.refs:
                raise HubError(409, "Reference already exists")
            start = self._commit_or_404(repo, body.get("startingPoint") or "main")
            repo.refs[branch] = start.id
        return self._json(200, {"name": branch})

    def h_commit(self, rtype, repo_id, rev):
        raw = self._read_body()
        create_pr = self.query.get("create_pr") in ("1", "true", "True")
        try:
            lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
        except ValueError:
            raise HubError(400, "commit body is not NDJSON") from None
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "the first line must be the header")
        header = lines[0]["value"]
        st = self.hub.state
        with st.lock:  # validate everything, then apply: all or nothing
            repo = st.repo(repo_id, rtype)
            parent = self._commit_or_404(repo, rev)
            if header.get("parentCommit") and not parent.id.startswith(header["parentCommit"]):
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(parent.files)
            for line in lines[1:]:
                key, v = line.get("key"), line.get("value") or {}
                path = v.get("path", "")
                if not path or path.startswith("/") or ".." in path.split("/"):
                    raise HubError(400, f"invalid path {path!r}")
                if key == "file":
                    content = base64.b64decode(v["content"]) if v.get("encoding") == "base64" else v["content"].encode()
                    files[path] = _regular(path, content)
                elif key == "lfsFile":
                    oid, size = v.get("oid"), v.get("size")
                    blob = st.blobs.get((repo_id, oid))
                    if blob is None or (size is not None and len(blob) != int(size)):
                        raise HubError(400, f"LFS file {path} ({oid}) was not uploaded")
                    files[path] = _lfs(path, oid, len(blob))
                elif key == "deletedFile":
                    if path not in files:
                        raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                    del files[path]
                elif key == "deletedFolder":
                    gone = [p for p in files if p.startswith(path.rstrip("/") + "/")]
                    if not gone:
                        raise HubError(404, "A folder with this name doesn't exist", "EntryNotFound")
                    for p in gone:
                        del files[p]
                else:
                    raise HubError(400, f"unknown commit line {key!r}")
            c = st.make_commit(repo, parent, header.get("summary") or "", header.get("description") or "", files)
            prefix = "" if rtype == "model" else f"{rtype}s/"
            pr_url = None
            if create_pr:
                repo.prs += 1
                repo.refs[f"refs/pr/{repo.prs}"] = c.id
                pr_url = f"{self.hub.url}/{prefix}{repo_id}/discussions/{repo.prs}"
            else:
                repo.refs[rev] = c.id
        return self._json(200, {"success": True, "commitOid": c.id,
                                "commitUrl": f"{self.hub.url}/{prefix}{repo_id}/commit/{c.id}",
                                "pullRequestUrl": pr_url})

    def h_resolve(self, rtype, repo_id, rev, path):
        st = self.hub.state
        with st.lock:
            repo = st.repo(repo_id, rtype)
            c = self._commit_or_404(repo, rev)
            e = c.files.get(path)
            if e is None:
                raise HubError(404, f"{path} does not exist at {rev}", "EntryNotFound")
            data = st.file_bytes(repo_id, e)
        headers = {"X-Repo-Commit": c.id, "ETag": f'"{e.oid}"', "Accept-Ranges": "none"}
        if e.is_lfs:
            headers.update({"X-Linked-Etag": f'"{e.sha256}"', "X-Linked-Size": str(e.size)})
        return self._send(200, data, headers=headers, content_type="application/octet-stream")


__all__ = ["Fault", "HubServer", "Logged", "git_blob_oid", "lfs_pointer"]
