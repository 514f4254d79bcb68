"""Registration API (design.md): its endpoints, as a table of (method, path pattern) ->
handler, over the Unix-socket HTTP server of unix_http.py.

A new endpoint is one handler below (what it reads from the daemon is in
:class:`ApiContext`, the document it answers with in documents.py) and one line of
``ROUTES``. A handler raises what the daemon's parts raise; :meth:`ApiServer.respond`
is the one place those errors become statuses.
"""

from __future__ import annotations

import re
import time
import typing
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgewatt.core.facts import cgroups, procfs
from edgewatt.core.sampling.passes import READ, RECORDED, nothing
from edgewatt.core.targets import (
    Conflict,
    Forbidden,
    NotFound,
    TargetError,
    TargetTable,
    TooMany,
    TooManyLookups,
)
from edgewatt.core.targets.access import check_owner
from edgewatt.exporter import documents, read_rules
from edgewatt.exporter.registration import (
    TARGET_ID,
    InvalidRegistration,
    parse_request,
    reject_unknown,
)
from edgewatt.exporter.shared_answer import Listing, OncePerPass, PerPass, Shared
from edgewatt.exporter.unix_http import (
    HttpError,
    PeerPerson,
    Request,
    Response,
    UnixHttpServer,
)

LOOKUP_HOLD_S = 1.0  # the longest a registration over its user's lookup bound is held
# The longest ?final=S waits for a window's power readings to come (its edges never
# wait: docs/reference.md): above the slowest source's period (powermetrics, 1 Hz
# tegrastats), well below a client's request timeout.
MAX_FINAL_WAIT_S = 10.0


@dataclass
class ApiContext:
    """What the endpoints read and call on the daemon."""

    table: TargetTable
    logical_cpus: int
    health: Callable[[], dict[str, Any]]  # the /healthz document
    host: Callable[[], dict[str, Any]]  # the /v1/host document
    sample_units: dict[str, str]
    sample_now: Callable[[str | None], Any]  # a pass that starts after the call, waited for
    # An edge's pass (Sampler.sample_edge) run up to a step; the rest, to run after
    # the answer. None: sample_now's whole pass.
    sample_edge: Callable[[str, str], Callable[[], None]] | None = None
    # Until the power readings after now have come, at most the seconds given.
    wait_settled: Callable[[float], None] = lambda timeout_s: None
    proc: str = "/proc"
    min_interval: float = 0.1  # seconds between fresh samples; a reload may change it
    pid_max: int = field(init=False)
    # The pass the answers are built for (the snapshot's sequence; None: none shared).
    pass_key: Callable[[], Hashable] = lambda: None
    changes: int = 0  # what requests changed in the table: a key of shared answers too
    top: OncePerPass[Listing] = field(init=False, default_factory=OncePerPass)  # GET /v1/top's
    listing: OncePerPass[Listing] = field(init=False, default_factory=OncePerPass)  # /v1/targets
    # Each target's description, summary and samples, by (kind, id), for the pass.
    shared: PerPass[Shared] = field(init=False, default_factory=PerPass)
    # The person of a uid (core/persons.py): what the table counts a target's uid as.
    person: Callable[[int], int] = lambda uid: uid

    def __post_init__(self) -> None:
        self.pid_max = procfs.pid_max(self.proc)

    def key(self) -> Hashable:
        """The key the answers shared now are built for (None: none is)."""
        at = self.pass_key()
        return None if at is None else (at, self.changes)

    def changed(self) -> None:
        self.changes += 1  # after the change: a build racing it is built again

    def edge(self, target_id: str, until: str) -> Callable[[], None]:
        """The target's edge pass up to ``until`` (sampler.READ, RECORDED); what is
        left of it, to run once the answer is written (Response.after)."""
        if self.sample_edge is None:
            self.sample_now(target_id)
            return nothing
        return self.sample_edge(target_id, until)

    def target(self, kind: str, target_id: str, build: Callable[[], dict[str, Any]]) -> Shared:
        """The target's ``kind`` of document for this pass, built once."""
        return self.shared.get(
            self.key(), (kind, target_id), lambda: Shared(build(), _owner(self, target_id))
        )


Handler = typing.Callable[[ApiContext, Request], Response]  # 3.8: abc.Callable takes no [...]

# The status each refusal of the table is answered with (any other TargetError: 400).
_STATUS: dict[type[TargetError], int] = {
    NotFound: 404,
    Forbidden: 403,
    Conflict: 409,
    TooMany: 429,
}


def ok(body: Any) -> Response:
    return Response(200, body)


# -- handlers: one per (method, path) ----------------------------------------------


def get_health(api: ApiContext, request: Request) -> Response:
    return ok(api.health())


def get_host(api: ApiContext, request: Request) -> Response:
    return ok(api.host())


def get_top(api: ApiContext, request: Request) -> Response:
    """`edgewatt top`'s one request a refresh: the device, the daemon's health and
    every target with its summary, all from the snapshot and tables the sampler built;
    built once a pass, whoever asks how often (a flood of it costs its sending), each
    reader sent what she may read of it (shared_answer.Listing)."""
    listing = api.top.get(api.key(), lambda: _top(api))
    return ok(listing.read_by(request.peer_uid))


def _top(api: ApiContext) -> Listing:
    device, table = api.host(), api.table
    targets, owners = [], []
    for described in table.describe_all():
        try:
            summary = table.summary(described["id"], api.logical_cpus)
            target = table.get(described["id"])
            rate = table.network_rate(described["id"])
        except TargetError:
            continue  # unregistered between the reads
        members = target.members  # replaced whole each pass
        targets.append(documents.top_target(described, summary, members, rate))
        owners.append(target.uid)
    return Listing(documents.top(device, api.health(), targets), "targets", owners)


def _readable(document: dict[str, Any], reader: int, owner: int | None) -> dict[str, Any]:
    """A target's ``document`` as ``reader`` may read it (read_rules.py)."""
    return document if read_rules.may_read_all(reader, owner) else read_rules.redacted(document)


def _owner(api: ApiContext, target_id: str) -> int | None:
    """Who registered the target (None: purged since it was read)."""
    try:
        return api.table.get(target_id).uid
    except NotFound:
        return None


def list_targets(api: ApiContext, request: Request) -> Response:
    member = request.argument("member")
    if member is None:
        listing = api.listing.get(api.key(), lambda: _listing(api))
        return ok(listing.read_by(request.peer_uid))
    if len(member) != 1:
        raise HttpError(400, "invalid member", "member must be one process id")
    pid = _member(member[0])
    # A process forked since the last pass is known once the targets that may hold it
    # are read: those alone (where a pass of every target costs ms; the last one's
    # answered once its row is written), and every target where none of them does.
    rest = nothing
    holders = _holders(api, pid)
    for target_id in holders[:-1]:
        api.sample_now(target_id)
    if holders:
        rest = api.edge(holders[-1], RECORDED)
    try:
        described = api.table.describe_all(pid)
        if not described:
            rest()
            rest = nothing
            api.sample_now(None)
            described = api.table.describe_all(pid)
        reader = request.peer_uid
        found = [_readable(t, reader, _owner(api, t["id"])) for t in described]
    except BaseException:
        rest()
        raise
    return Response(200, documents.targets(found), after=rest)


def _member(text: str) -> int:
    """A process id given in a path or a query."""
    if not text.isdigit() or len(text) > 10:
        raise HttpError(400, "invalid member", "member must be one process id")
    return int(text)


def _holders(api: ApiContext, pid: int) -> list[str]:
    """The running targets that may hold process ``pid`` (TargetTable.holders_of), as
    its ancestors and its cgroup now say, in the table's order."""

    def cgroup() -> str | None:
        try:
            return cgroups.cgroup_of(pid, api.proc)
        except (OSError, ValueError):  # gone, or a v1-only host (InvalidCgroup)
            return None

    return api.table.holders_of(pid, lambda: procfs.ancestors(pid, api.proc), cgroup)


def _listing(api: ApiContext) -> Listing:
    described = api.table.describe_all()
    owners = [_owner(api, t["id"]) for t in described]
    return Listing(documents.targets(described), "targets", owners)


def register_target(api: ApiContext, request: Request) -> Response:
    registration = parse_request(request.json(), request.peer_pid, api.pid_max)
    if request.person is not None and api.person(request.peer_uid) != request.person:
        # A uid of her namespace the daemon could not learn as hers (persons.py):
        # the table would count its targets as nobody's share.
        detail = f"uid {request.peer_uid} of user {request.person}'s namespaces: too many known"
        raise TooMany("too many uids", detail)
    if registration.cgroup is not None:
        try:
            held = api.table.register_cgroup(
                registration.cgroup,
                registration.labels,
                request.peer_uid,
                procfs.groups(request.peer_pid, api.proc),
                command=registration.command,
            )
        except TooManyLookups as refused:
            # The 429 comes when a lookup could run again (at most 1 s): a flood
            # over the bound then costs a request a second per connection, not
            # one per round trip.
            time.sleep(min(LOOKUP_HOLD_S, refused.retry_s or LOOKUP_HOLD_S))
            raise
    else:
        held = api.table.register(
            registration.pid,
            registration.labels,
            registration.children,
            request.peer_uid,
            command=registration.command,
        )
    api.changed()
    # Registration is a sample: the summary's baseline is read now, so what the
    # process did before is excluded and nothing after it is lost. The answer holds
    # nothing of the pass: it is written once the counters are read, as a phase's start.
    rest = api.edge(held.target.id, READ) if held.created else nothing
    try:
        answer = documents.registered(held.target.describe(), api.min_interval, held.refused)
    except BaseException:
        rest()
        raise
    return Response(201 if held.created else 200, answer, after=rest)


def get_target(api: ApiContext, request: Request) -> Response:
    target_id = request.params["id"]
    if request.argument("fresh") == ["1"]:
        _fresh(api, target_id)
    shared = api.target("target", target_id, lambda: api.table.describe(target_id))
    return ok(shared.read_by(request.peer_uid))


def delete_target(api: ApiContext, request: Request) -> Response:
    request.body()
    target_id = request.params["id"]
    target = api.table.get(target_id)
    if target.holders == 1 and target.state == "running":
        # Its last registration goes: its figures run to now, then it ends (kept to read).
        check_owner(target, request.peer_uid)
        api.sample_now(target_id)
    try:
        return ok(api.table.delete(target_id, request.peer_uid).describe())
    finally:
        api.changed()


# A phase's edges are samples: the pass taken at each closes the phase that ends and
# opens the one that starts, so adjacent phases add up.


# Phases nest (history.py): "depth" starts one at that depth (0, the default: ending
# every running phase), "inside": true inside every running one (a tracked call, an
# FL round); DELETE ?depth=N ends N and deeper, without it the innermost. No edge
# waits for a power reading: ?final=S waits at most S seconds for the figures to be
# final (the readings after the window's edges come).


def start_phase(api: ApiContext, request: Request) -> Response:
    return _start_phase(api, request, request.params["id"])


def start_member_phase(api: ApiContext, request: Request) -> Response:
    """A phase on the widest running target that holds process {pid} (a SuperNode's
    rather than its ClientApp's own): a Flower ClientApp's round start in one request,
    without a pass of every target where its holders are known (list_targets)."""
    pid = _member(request.params["pid"])
    holders = _holders(api, pid)
    if not holders:  # one forked and re-parented since the last pass: every target read
        api.sample_now(None)
        holders = [t["id"] for t in api.table.describe_all(pid)]
    widest = [h for h in holders if _pid_of(api, h) != pid] or holders
    if not widest:
        raise NotFound("not held", f"no running target holds process {pid}")
    return _start_phase(api, request, widest[0], member=True)


def _pid_of(api: ApiContext, target_id: str) -> int | None:
    try:
        return api.table.get(target_id).pid
    except NotFound:
        return None  # purged since it was found


def _start_phase(
    api: ApiContext, request: Request, target_id: str, member: bool = False
) -> Response:
    """The phase a request's body names started on ``target_id`` (``member``: the
    answer names the target's process too)."""
    body = request.json()
    reject_unknown(body, {"name", "depth", "inside"})
    depth = body.get("depth", 0)
    inside = body.get("inside", False)
    if not isinstance(depth, int) or isinstance(depth, bool) or not isinstance(inside, bool):
        raise HttpError(400, "invalid phase depth", "depth is a count, inside true or false")
    at = None if inside else depth
    phase = api.table.start_phase(target_id, body.get("name"), request.peer_uid, at)
    api.changed()
    answer = documents.phase_started(target_id, phase.name, phase.started_at, phase.depth)
    if member:
        answer["pid"] = _pid_of(api, target_id)
    # The answer holds nothing of the pass: once the counters and the power are read
    # at the edge's instant, the caller may go on while the rows are written.
    return Response(201, answer, after=api.edge(target_id, READ))


def end_phase(api: ApiContext, request: Request) -> Response:
    target_id = request.params["id"]
    request.body()
    depth = _count(request, "depth")
    ended = api.table.end_phase(target_id, request.peer_uid, depth)
    api.changed()
    if ended is None:
        return ok(documents.phase_ended(target_id))
    # The answer is the closing row's: the snapshot and the exporters' part of the
    # pass follow it (never a wait for final figures, which holds no pass).
    if request.argument("final"):  # a wait for final figures holds no pass
        api.sample_now(target_id)
        _wait_final(api, target_id, request)
        rest = nothing
    else:
        rest = api.edge(target_id, RECORDED)
    try:
        summary = api.table.phase_summary(target_id, ended, api.logical_cpus)
    except BaseException:
        rest()
        raise
    return Response(200, documents.phase_ended(target_id, ended.name, summary), after=rest)


def get_summary(api: ApiContext, request: Request) -> Response:
    # To now: a running target is sampled first (a script's summary at its end holds
    # its last second too).
    target_id = request.params["id"]
    if request.argument("fresh") == ["1"] and api.table.get(target_id).state == "running":
        api.sample_now(target_id)
    _wait_final(api, target_id, request)
    # Final or not is part of its name: one built before its energy settled is not
    # the answer once it has.
    kind = "summary final" if api.table.final(target_id) else "summary"
    shared = api.target(kind, target_id, lambda: api.table.summary(target_id, api.logical_cpus))
    return ok(shared.read_by(request.peer_uid))


def _wait_final(api: ApiContext, target_id: str, request: Request) -> None:
    """?final=S: wait at most S seconds for the target's figures to be final."""
    values = request.argument("final")
    if not values:
        return
    try:
        timeout = float(values[0])
    except ValueError:
        timeout = -1.0
    if not 0 <= timeout <= MAX_FINAL_WAIT_S:  # NaN too
        detail = f"final must be the seconds to wait, 0 to {MAX_FINAL_WAIT_S:g}"
        raise HttpError(400, "invalid final", detail)
    if not api.table.final(target_id):
        api.wait_settled(timeout)


def _count(request: Request, name: str) -> int | None:
    values = request.argument(name)
    if not values:
        return None
    if len(values) != 1 or not values[0].isdigit() or len(values[0]) > 3:
        raise HttpError(400, f"invalid {name}", f"{name} must be one count")
    return int(values[0])


def get_samples(api: ApiContext, request: Request) -> Response:
    target_id = request.params["id"]
    since = _since(request)

    def build() -> dict[str, Any]:
        rows = api.table.samples(target_id, since)
        return documents.samples(target_id, api.sample_units, rows)

    if since is None:  # the whole history: the same for every request in the pass
        return ok(api.target("samples", target_id, build).read_by(request.peer_uid))
    return ok(_readable(build(), request.peer_uid, _owner(api, target_id)))


def _fresh(api: ApiContext, target_id: str) -> None:
    """A sample of a running target younger than min_interval: a monitor's read at
    its own cadence, whatever the daemon's interval."""
    table = api.table
    if table.get(target_id).state != "running":
        return
    # Aged on the monotonic clock: a wall-clock step makes no stale sample fresh.
    age = table.sample_age(target_id)
    if age is not None and age < api.min_interval:
        return
    api.sample_now(target_id)


def _since(request: Request) -> float | None:
    values = request.argument("since")
    if not values:
        return None
    try:
        return float(values[0])
    except ValueError:
        raise HttpError(400, "invalid since", "since must be a unix timestamp in seconds") from None


# -- the table -------------------------------------------------------------------


class Router:
    """Finds a request's handler in a table of path pattern -> {method: handler}, where
    {name} in a pattern stands for one segment, handed to the handler as a param: 404
    when no pattern matches the path (or its target id is malformed), 405 naming the
    methods that would have worked."""

    def __init__(self, table: Mapping[str, Mapping[str, Handler]]) -> None:
        self._table = tuple((p, re.compile(_regex(p)), dict(ms)) for p, ms in table.items())

    def find(self, request: Request) -> Handler:
        match, methods = self._match(request.path)
        target_id = match.groupdict().get("id")
        if target_id is not None and not TARGET_ID.fullmatch(target_id):
            raise HttpError(404, "no such target", f"{target_id[:80]!r} is not a target id")
        if request.method not in methods:
            detail = f"{request.method} not allowed; use {', '.join(methods)}"
            raise HttpError(405, "method not allowed", detail)
        request.params = match.groupdict()
        return methods[request.method]

    def endpoints(self) -> list[tuple[str, str]]:
        """(method, path pattern) of every endpoint, in the table's order."""
        return [(method, pattern) for pattern, _, methods in self._table for method in methods]

    def _match(self, path: str) -> tuple[re.Match[str], dict[str, Handler]]:
        for _, regex, methods in self._table:
            match = regex.fullmatch(path)
            if match is not None:
                return match, methods
        raise HttpError(404, "not found", f"no endpoint at {path[:200]!r}")


def _regex(pattern: str) -> str:
    return re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(pattern))


ROUTES = Router(
    {
        "/healthz": {"GET": get_health, "HEAD": get_health},
        "/v1/host": {"GET": get_host},
        "/v1/top": {"GET": get_top},
        "/v1/targets": {"GET": list_targets, "POST": register_target},
        "/v1/targets/{id}": {"GET": get_target, "DELETE": delete_target},
        "/v1/targets/{id}/phase": {"POST": start_phase, "DELETE": end_phase},
        "/v1/targets/{id}/summary": {"GET": get_summary},
        "/v1/targets/{id}/samples": {"GET": get_samples},
        "/v1/members/{pid}/phase": {"POST": start_member_phase},
    }
)


class ApiServer(UnixHttpServer):
    """The registration API at ``path``, answering from ``context``."""

    def __init__(self, path: str, context: ApiContext, person: PeerPerson) -> None:
        self.context = context
        super().__init__(path, self.respond, person)

    @property
    def min_interval(self) -> float:
        return self.context.min_interval

    @min_interval.setter
    def min_interval(self, seconds: float) -> None:  # a reload's
        self.context.min_interval = seconds

    def respond(self, request: Request) -> Response:
        handler = ROUTES.find(request)
        try:
            return handler(self.context, request)
        except (InvalidRegistration, TargetError) as exc:
            return refusal(exc)


def refusal(exc: InvalidRegistration | TargetError) -> Response:
    """The one place where the daemon's parts' errors become statuses: the connection
    stays open (the request was read whole)."""
    if isinstance(exc, InvalidRegistration):
        status = 400
    else:
        status = next((s for kind, s in _STATUS.items() if isinstance(exc, kind)), 400)
    return Response(status, documents.error(exc.error, exc.detail))
