"""A stored declaration and the one a DAG file declares now: what may change between them
(outputs added, the source's tuning), what may not (a state's keys or table, the source), and
whose a topology is (one DAG runs it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..spec import EVOLUTION_KEYS, version_name

# Settings a topology may change between deployments: they shape future batches only. Anything
# else -- where the source is, the states' keys, types, rules and tables -- decides what the
# committed offsets and state values *mean*, and may not change under them. (The DAG that runs a
# topology may never change: see other_owner.)
MUTABLE_SOURCE_SETTINGS = frozenset({"max_files", "settle_seconds", "max_batch_bytes", "listing",
                                     "full_listing_seconds"})
_STATE_IDENTITY = ("keys", "combiner", "value_type", "kind", "table", "database", "schema", "version")


def _identity(config: Mapping[str, Any]) -> dict[str, Any]:
    source = {k: v for k, v in dict(config["source"]).items() if k not in MUTABLE_SOURCE_SETTINGS}
    states = {s["name"]: {**{k: s.get(k) for k in _STATE_IDENTITY}, "version": int(s.get("version", 1))}
              for s in config["states"]}
    outputs = {o["name"]: o["log"] for o in config.get("outputs", ())}
    # A decision's rule (floor, headroom) may change for later requests; the state it keeps may not.
    decisions = {d["name"]: d["state"] for d in config.get("decisions", ())}
    return {"source": source, "states": states, "outputs": outputs, "decisions": decisions}


def incompatible_changes(stored: Mapping[str, Any], declared: Mapping[str, Any]) -> list[str]:
    """What ``declared`` changes of ``stored`` that committed progress depends on (empty: none)."""
    old, new = _identity(stored), _identity(declared)
    changes = []
    if old["source"] != new["source"]:
        changes.append(f"source {old['source']} -> {new['source']}")
    for name in sorted(set(old["states"]) | set(new["states"])):
        before, after = old["states"].get(name), new["states"].get(name)
        if before is None:
            changes.append(f"state {name!r} added")
        elif after is None:
            changes.append(f"state {name!r} removed")
        else:
            changed = [f"state {name!r} {k} {before[k]!r} -> {after[k]!r}" for k in _STATE_IDENTITY
                       if before[k] != after[k]]
            if changed and before["version"] == after["version"]:
                changed[-1] += (f" (to redefine it, declare it with version={before['version'] + 1}: it is "
                                "built beside the live one and switched in once approved)")
            changes += changed
    # An output may be added (later batches append to it) but not moved or dropped: staged and
    # downstream readers count on it.
    for name, log in sorted(old["outputs"].items()):
        if new["outputs"].get(name) != log:
            changes.append(f"output {name!r} (log {log!r}) " + ("removed" if name not in new["outputs"]
                                                               else f"now appends to {new['outputs'][name]!r}"))
    for name, state in sorted(old["decisions"].items()):
        if new["decisions"].get(name) != state:
            changes.append(f"decision {name!r} (state {state!r}) " + ("removed" if name not in new["decisions"]
                                                                     else f"now keeps {new['decisions'][name]!r}"))
    return changes


def other_owner(stored: Mapping[str, Any], declared: Mapping[str, Any]) -> str | None:
    """The DAG that runs the stored topology when ``declared`` comes from another one (else None).

    Compared only when both declarations name their DAG (older ones do not)."""
    old, new = (c.get("dag_id") for c in (stored, declared))
    return str(old) if old and new and old != new else None


def evolved(stored: Mapping[str, Any], declared: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``declared`` as it is kept over ``stored`` once the topology has progress: its settings, the
    stored live and building states, each state it adds -- or declares at a higher version than the
    live one: ``<name>__v<version>`` -- as ``declared`` and each live state it no longer declares as
    ``retiring`` -- both waiting for the owner's approval
    (``core/evolution.py``) -- and what it changes that may not change (a live or building state
    changed, a building one removed, a retired one's name taken again, the source, ...). A declared
    state it no longer declares is forgotten: nothing was built of it."""
    declared = _redefinitions(stored, declared)
    live = [s["name"] for s in stored["states"]]
    building = [s["name"] for s in stored.get("building", ())]
    retired = dict(stored.get("retired") or {})
    names = {s["name"] for s in declared["states"]}
    retiring = [n for n in live if n not in names]
    kept_names = (set(live) - set(retiring)) | set(building)
    stored_side = {**stored, "states": [s for s in (*stored["states"], *stored.get("building", ()))
                                        if s["name"] in kept_names]}
    declared_side = {**declared, "states": [s for s in declared["states"] if s["name"] in kept_names]}
    changes = incompatible_changes(stored_side, declared_side)
    changes += [f"state {n!r} was retired at txid {retired[n]['txid']} and is kept as it was: drop it first "
                f"('airflow-txn evolve {stored['topology_id']} --drop {n}') or give the new one another name"
                for n in sorted(names & set(retired))]
    added = [dict(s) for s in declared["states"] if s["name"] not in {*live, *building, *retired}]
    config = {k: v for k, v in declared.items() if k not in ("states", *EVOLUTION_KEYS)}
    config["states"] = list(stored["states"])
    for key, value in (("building", list(stored.get("building", ()))), ("declared", added),
                       ("retiring", retiring), ("built", dict(stored.get("built") or {})), ("retired", retired)):
        if value:
            config[key] = value
    return config, changes


def _redefinitions(stored: Mapping[str, Any], declared: Mapping[str, Any]) -> dict[str, Any]:
    """``declared`` with each live state it declares at a higher version split in two: the live
    one as stored (kept until the switch) and the new version, ``<name>__v<version>`` replacing it
    (declared, or the one being built)."""
    live = {s["name"]: s for s in stored["states"]}
    states = []
    for s in declared["states"]:
        was = live.get(s["name"])
        if was is not None and int(s.get("version", 1)) > int(was.get("version", 1)):
            states += [dict(was), {**s, "name": version_name(s["name"], int(s["version"])), "replaces": s["name"]}]
        else:
            states.append(s)
    return {**declared, "states": states}
