"""The scheduler-extender wire format (k8s.io/kube-scheduler/extender/v1): exact capitalised field names.

Requests are decoded strictly by the names kube-scheduler sends (`Pod`, `NodeNames`, ...); a request that
uses another casing gets an error that says so. Embedded objects (Pod, Node) are Kubernetes JSON and are
kept as dicts. Every decoder raises WireError with a message naming the field and what is expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

import orjson

from memslice import errors

MAX_NODE_NAMES = 100_000
MAX_NAME_LEN = 253
NAMES_LAST = b',"NodeNames":'  # ExtenderArgs' last member as kube-scheduler writes it (see split_names_last)
MAX_JSON_VALUES = 500_000  # a filter of 50,000 nodes holds ~52,000; 100,000 names (MAX_NODE_NAMES) fit
# The most values split_names_last lets a head hold: with the MAX_NODE_NAMES names (and their array) a fast
# path may read after it, a request it serves holds at most MAX_JSON_VALUES, as the server's count allows.
MAX_HEAD_VALUES = MAX_JSON_VALUES - MAX_NODE_NAMES - 1


def json_values_bound(data: bytes | bytearray | memoryview) -> int:
    """An upper bound on the JSON values and object keys in `data` (each follows a `[`, `{`, `,` or `:`,
    or is the first), counted at C speed before parsing; bytes inside strings only raise the bound. One
    deleting pass rather than four counts: 33 against 73 us for a filter of 5,000 names (65 KB); the copy
    it makes is smaller than the body, which the request's budget already holds twice over."""
    raw = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    return len(raw) - len(raw.translate(None, b",:[{")) + 1


class WireError(errors.InputError):
    """A request that does not follow the extender API; answered with HTTP 400 and an `Error`."""


def _field(obj: dict[str, Any], name: str, where: str, required: bool = True) -> Any:
    if name in obj:
        return obj[name]
    if required:
        other = next((k for k in obj if isinstance(k, str) and k.lower() == name.lower()), None)
        hint = f" (found {other!r}: field names are case-sensitive, write {name!r})" if other else ""
        raise WireError(f"{where}: field {name!r} is required{hint}")
    return None


def _name(value: Any, where: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise WireError(f"{where} must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise WireError(f"{where} must not be empty")
    if len(value) > MAX_NAME_LEN:
        raise WireError(f"{where} is {len(value)} characters long; Kubernetes names have at most "
                        f"{MAX_NAME_LEN}")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WireError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def decode_pod(value: Any, where: str = "Pod") -> dict[str, Any]:
    pod = _object(value, where)
    meta = _object(pod.get("metadata"), f"{where}.metadata")
    _name(meta.get("name"), f"{where}.metadata.name")
    _name(meta.get("namespace", "default"), f"{where}.metadata.namespace")
    if "uid" in meta:
        _name(meta["uid"], f"{where}.metadata.uid", allow_empty=True)
    _object(pod.get("spec"), f"{where}.spec")
    return pod


def _all_names(values: list[Any]) -> bool:
    """Every value a non-empty string of at most MAX_NAME_LEN characters, in C-speed passes (this checks
    every node name of every filter and prioritize call): join() refuses anything but strings."""
    if not values:
        return True
    try:
        "".join(values)
    except TypeError:
        return False
    return "" not in values and max(map(len, values)) <= MAX_NAME_LEN


@dataclass(frozen=True)
class ExtenderArgs:
    pod: dict[str, Any]
    node_names: list[str] | None  # nodeCacheCapable
    nodes: list[dict[str, Any]] | None  # full NodeList items otherwise
    names_checked: bool = True  # False: node_names is a list of anything yet (see check_names)

    def names(self) -> list[str]:
        if self.node_names is not None:
            return self.node_names
        return [n["metadata"]["name"] for n in self.nodes or []]


def check_names(args: ExtenderArgs) -> ExtenderArgs:
    """`args` with its NodeNames checked (WireError names the first bad one)."""
    raw = args.node_names
    if args.names_checked or raw is None:
        return args
    names = raw if _all_names(raw) else [_name(n, f"ExtenderArgs.NodeNames[{i}]") for i, n in enumerate(raw)]
    return ExtenderArgs(args.pod, names, args.nodes)


def decode_extender_args(body: Any, check: bool = True) -> ExtenderArgs:
    """The request's ExtenderArgs. With check=False the NodeNames are not checked one by one yet: the verbs
    first look them up, and a name found among the nodes the extender knows is a node's name, valid by
    construction; they call check_names() before anything else reads or echoes the names."""
    args = _object(body, "request body (ExtenderArgs)")
    pod = decode_pod(_field(args, "Pod", "ExtenderArgs"))
    raw_names = _field(args, "NodeNames", "ExtenderArgs", required=False)
    raw_nodes = _field(args, "Nodes", "ExtenderArgs", required=False)
    if raw_names is None and raw_nodes is None and not any(
            isinstance(k, str) and k.lower() in ("nodenames", "nodes") for k in args):
        raise WireError("ExtenderArgs: one of 'NodeNames' (nodeCacheCapable: true) or 'Nodes' is required")
    if raw_names is None and raw_nodes is None:
        _field(args, "NodeNames", "ExtenderArgs")  # raises with the casing hint
    names = None
    if raw_names is not None:
        if not isinstance(raw_names, list):
            raise WireError(f"ExtenderArgs.NodeNames must be a list of node names, got "
                            f"{type(raw_names).__name__}")
        if len(raw_names) > MAX_NODE_NAMES:
            raise WireError(f"ExtenderArgs.NodeNames has {len(raw_names)} names; at most {MAX_NODE_NAMES}")
        if not check:
            return ExtenderArgs(pod, raw_names, None, names_checked=False)
        names = check_names(ExtenderArgs(pod, raw_names, None, names_checked=False)).node_names
    nodes = None
    if raw_nodes is not None and names is None:
        node_list = _object(raw_nodes, "ExtenderArgs.Nodes")
        items = node_list.get("items") or []
        if not isinstance(items, list):
            raise WireError("ExtenderArgs.Nodes.items must be a list of Node objects")
        if len(items) > MAX_NODE_NAMES:
            raise WireError(f"ExtenderArgs.Nodes has {len(items)} nodes; at most {MAX_NODE_NAMES}")
        nodes = []
        for i, n in enumerate(items):
            node = _object(n, f"ExtenderArgs.Nodes.items[{i}]")
            _name(_object(node.get("metadata"), f"ExtenderArgs.Nodes.items[{i}].metadata").get("name"),
                  f"ExtenderArgs.Nodes.items[{i}].metadata.name")
            nodes.append(node)
    return ExtenderArgs(pod, names, nodes)


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def decode_binding_args(body: Any) -> BindingArgs:
    args = _object(body, "request body (ExtenderBindingArgs)")
    w = "ExtenderBindingArgs"
    return BindingArgs(
        pod_name=_name(_field(args, "PodName", w), f"{w}.PodName"),
        pod_namespace=_name(_field(args, "PodNamespace", w), f"{w}.PodNamespace"),
        pod_uid=_name(_field(args, "PodUID", w), f"{w}.PodUID"),  # the bind is of this very pod
        node=_name(_field(args, "Node", w), f"{w}.Node"))


@dataclass(frozen=True)
class Victims:
    uids: list[str]
    pods: list[dict[str, Any]] | None  # full pods when the scheduler sent NodeNameToVictims
    num_pdb_violations: int


@dataclass(frozen=True)
class PreemptionArgs:
    pod: dict[str, Any]
    victims: dict[str, Victims]


def _pdb(value: Any, where: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WireError(f"{where}.NumPDBViolations must be a non-negative integer")
    return value


def decode_preemption_args(body: Any) -> PreemptionArgs:
    args = _object(body, "request body (ExtenderPreemptionArgs)")
    w = "ExtenderPreemptionArgs"
    pod = decode_pod(_field(args, "Pod", w))
    meta = _field(args, "NodeNameToMetaVictims", w, required=False)
    full = _field(args, "NodeNameToVictims", w, required=False)
    if meta is None and full is None:
        _field(args, "NodeNameToMetaVictims", w)
    out: dict[str, Victims] = {}
    if meta is not None:
        for node, v in _object(meta, f"{w}.NodeNameToMetaVictims").items():
            where = f"{w}.NodeNameToMetaVictims[{node!r}]"
            _name(node, f"{w}.NodeNameToMetaVictims key")
            v = _object(v, where)
            pods = v.get("Pods") or []
            if not isinstance(pods, list):
                raise WireError(f"{where}.Pods must be a list")
            uids = [_name(_object(p, f"{where}.Pods[{i}]").get("UID"), f"{where}.Pods[{i}].UID")
                    for i, p in enumerate(pods)]
            out[node] = Victims(uids, None, _pdb(v.get("NumPDBViolations"), where))
    else:
        for node, v in _object(full, f"{w}.NodeNameToVictims").items():
            where = f"{w}.NodeNameToVictims[{node!r}]"
            _name(node, f"{w}.NodeNameToVictims key")
            v = _object(v, where)
            pods = v.get("Pods") or []
            if not isinstance(pods, list):
                raise WireError(f"{where}.Pods must be a list")
            decoded = [decode_pod(p, f"{where}.Pods[{i}]") for i, p in enumerate(pods)]
            uids = [_name(p["metadata"].get("uid"), f"{where}.Pods[{i}].metadata.uid")
                    for i, p in enumerate(decoded)]
            out[node] = Victims(uids, decoded, _pdb(v.get("NumPDBViolations"), where))
    return PreemptionArgs(pod, out)


# ---------------------------------------------------------------------------------------------- results

def filter_result(args: ExtenderArgs | None, passed: list[str], failed: dict[str, str],
                  unresolvable: dict[str, str], error: str = "") -> dict[str, Any]:
    """ExtenderFilterResult. In node-cache mode (NodeNames in) answer NodeNames; with full Nodes in,
    answer the passing Node objects (the scheduler reads `Nodes` then)."""
    names: list[str] | None = passed
    nodes: dict[str, Any] | None = None
    if args is not None and args.node_names is None and args.nodes is not None:
        keep = set(passed)
        nodes = {"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                 "items": [n for n in args.nodes if n["metadata"]["name"] in keep]}
        names = None
    if error:
        names, nodes = None, None
    return {"Nodes": nodes, "NodeNames": names, "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable, "Error": error}


class JsonParts(tuple[bytes, ...]):
    """JSON text already encoded, in parts: the server sends them one after the other (one sendmsg), never
    joined. bytes() of it is the whole text."""

    def __bytes__(self) -> bytes:
        return b"".join(self)


FILTER_NAMES_HEAD = b'{"Nodes":null,"NodeNames":'
FILTER_NAMES_TAIL = b',"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'


def filter_names_answer(names_json: bytes) -> JsonParts:
    """ExtenderFilterResult JSON (as filter_result() for NodeNames in, nothing failed) whose NodeNames are
    `names_json`, a JSON array written as it came (the request's own NodeNames, when every node passed). In
    three parts: joining them copied the 65 KB array of 5,000 names twice per filter (benchmarks/README.md,
    issue 39, fifth pass)."""
    return JsonParts((FILTER_NAMES_HEAD, names_json, FILTER_NAMES_TAIL))


def names_json(names: list[str]) -> bytes:
    """NodeNames as JSON, as the server writes filter's answer (orjson), and as kube-scheduler writes the same
    names back in the prioritize that follows: Go's encoder and orjson write a node name ([a-z0-9.-]) alike."""
    return orjson.dumps(names)


def split_names_last(data: bytearray) -> tuple[dict[str, Any], bytes] | None:
    """ExtenderArgs whose last member is NodeNames, as kube-scheduler writes them (Go encodes a struct's fields
    in order: Pod, Nodes, NodeNames): (the object without that member, the array's bytes as written), or None
    when `data` does not end so (the caller decodes it whole). Why: prioritize can then compare the array's
    bytes with those its pod's filter passed, and decodes no name (benchmarks/README.md, "All names per
    filter, natively"). Sound for any bytes: `head + "}"` decodes to an object only if the cut lies between
    two members of the top-level object (outside every string, at depth 1), so `data` is that object with one
    more member, `"NodeNames":` and the rest; the caller still decodes or compares that rest. A head with a
    NodeNames member of any casing is refused (a second one would decide which wins). `data` is changed for
    the head's decoding only (its ',' turned into '}', then back). The cut is sought from the start (the pod
    comes first, the 5,000 names after it: reading back from the end went over all of them), then, when the
    head there does not decode (the text inside the pod), from the end. A head that may hold more than
    MAX_HEAD_VALUES values is not decoded (None: the server counts the whole body's values first, and refuses
    what holds too many): no request a fast path serves holds more than the server would parse."""
    split = split_names_last_at(data)
    return None if split is None else (split[0], split[1])


def split_names_last_at(data: bytearray) -> tuple[dict[str, Any], bytes, int] | None:
    """split_names_last(), with where the head ends (the cut: `data[:cut]` are the head's bytes, `,"NodeNames":`
    follows)."""
    if not data.endswith(b"]}"):
        return None
    first = data.find(NAMES_LAST)
    head = _head_at(data, first)
    if head is None and (last := data.rfind(NAMES_LAST)) != first:
        first, head = last, _head_at(data, last)
    if head is None:
        return None
    return head, _tail(data, first + len(NAMES_LAST)), first


def names_after_head(data: bytearray, head: bytes) -> bytes | None:
    """The NodeNames bytes of `data` when it is `head` followed by `,"NodeNames":`, the array and `}`, and its
    first `,"NodeNames":` is that one: where split_names_last() on `data` would cut it when `head` + `}` decodes
    (the caller saw it decode), so the head is the one `head` decodes to and need not be decoded again. None
    otherwise. Why: kube-scheduler's prioritize carries the very pod bytes of the filter before it (one cycle,
    one encoding of the pod), and decoding the pod again was ~17 us per pod (benchmarks/README.md, "Where each
    pod's time goes")."""
    cut = len(head)
    if not data.endswith(b"]}") or not data.startswith(head) or data.find(NAMES_LAST, 0, cut + len(NAMES_LAST)) != cut:
        return None
    return _tail(data, cut + len(NAMES_LAST))


def _tail(data: bytearray, start: int) -> bytes:
    """data[start:-1] as bytes, copied once (a bytearray's slice is a bytearray copied again by bytes(): 65 KB
    twice per verb with all 5,000 names)."""
    with memoryview(data) as view:
        return bytes(view[start:-1])


def _head_at(data: bytearray, cut: int) -> dict[str, Any] | None:
    """The object `data[:cut] + "}"` decodes to, when it is one without a NodeNames member (any casing) and
    may hold at most MAX_HEAD_VALUES values; else None."""
    if cut <= 0:
        return None
    data[cut] = ord("}")  # the head decoded in place (no copy of a large pod): `{...}` then `"NodeNames":...`
    try:
        with memoryview(data) as view:
            if json_values_bound(view[:cut]) > MAX_HEAD_VALUES:
                return None
            head = orjson.loads(view[:cut + 1])
    except (ValueError, RecursionError):
        return None
    finally:
        data[cut] = ord(",")
    if not isinstance(head, dict) or not head or any(k.lower() == "nodenames" for k in head):
        return None
    return head


def decode_pod_of(head: dict[str, Any]) -> dict[str, Any]:
    """The Pod of ExtenderArgs (WireError as decode_extender_args raises it)."""
    return decode_pod(_field(head, "Pod", "ExtenderArgs"))


def host_priority_list(scores: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """HostPriorityList: a bare JSON array of {Host, Score}."""
    return [{"Host": host, "Score": s} for host, s in scores]


def host_priority_json(host: str, score: int) -> str:
    """One HostPriority as JSON text: prioritize answers are these, joined (see host_priority_array)."""
    return f'{{"Host":{encode_basestring_ascii(host)},"Score":{int(score)}}}'


def host_priority_array(items: list[str]) -> bytes:
    """HostPriorityList as JSON bytes from host_priority_json texts (the server sends bytes as they are)."""
    return ("[" + ",".join(items) + "]").encode()


def encode_host_priority_list(hosts: list[str], scores: list[int]) -> bytes:
    """host_priority_list(zip(hosts, scores)) as JSON bytes, written directly (no dict per host)."""
    return host_priority_array([host_priority_json(h, s) for h, s in zip(hosts, scores, strict=True)])


def binding_result(error: str = "") -> dict[str, Any]:
    return {"Error": error}


def preemption_result(victims: dict[str, Victims]) -> dict[str, Any]:
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in v.uids], "NumPDBViolations": v.num_pdb_violations}
        for node, v in victims.items()}}
