"""Decisions in commit order: the OLEP payment executor as a topology. Requests are validated
in parallel processing; the commit grants or declines each, per source account in log order, on
the committed balance, and appends the payment events of the granted ones for a second stage
that credits the receiving accounts. The invariants hold, and the verdicts match a sequential
oracle."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from typing import Any

import pytest

from airflow_transactional import DecisionSpec, OutputEvent, OutputSpec, Request
from airflow_transactional.cli import main as cli
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.core import attempts
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.sources.eventlog import partition_of
from airflow_transactional.spec import StateSpec, TopologySpec
from airflow_transactional.store import decisions
from dev import faults
from tests.helpers import query

pytestmark = pytest.mark.integration

ACCOUNTS = {f"a{i}": (100 * (i % 4), 50 * (i % 3)) for i in range(8)}  # account: (opening, overdraft)
FEE_OVER, FEE = 150, 2  # a payment over FEE_OVER costs the payer FEE, paid to the fees account


def payments() -> TopologySpec:
    return TopologySpec(
        "payments", PostgresLogSource("requests"),
        [StateSpec("debits", {"account": "text"}), StateSpec("requests_seen", {"account": "text"}, combiner="count")],
        outputs=[OutputSpec("ledger", partitions=3)],
        decisions=[DecisionSpec("pay", state="debits", headroom="public.headroom")], max_batch_size=25)


def settlement() -> TopologySpec:
    return TopologySpec("settlement", PostgresLogSource("ledger"),
                        [StateSpec("credits", {"account": "text"}),
                         StateSpec("statement_lines", {"account": "text"}, combiner="count")], max_batch_size=40)


def pay_fn(req: dict[str, Any]) -> list[Any]:
    """Parallel validation, then one request for the serial decision."""
    rid, src, dst, amount = req["id"], req["from"], req["to"], req["amount"]
    if src not in ACCOUNTS or dst not in ACCOUNTS or src == dst:
        raise ValueError(f"unknown or same accounts {src!r} -> {dst!r}")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise ValueError(f"amount must be a positive integer, got {amount!r}")
    fee = FEE if amount > FEE_OVER else 0
    granted = [OutputEvent("ledger", {"type": "outgoing", "request": rid, "account": src, "amount": amount + fee},
                           key=src, id=f"{rid}:outgoing"),
               OutputEvent("ledger", {"type": "incoming", "request": rid, "account": dst, "amount": amount},
                           key=dst, id=f"{rid}:incoming")]
    if fee:
        granted.append(OutputEvent("ledger", {"type": "incoming", "request": rid, "account": "fees", "amount": fee},
                                   key="fees", id=f"{rid}:fee"))
    declined = [OutputEvent("ledger", {"type": "declined", "request": rid, "account": src}, key=src,
                            id=f"{rid}:declined")]
    return [("requests_seen", (src,), 1), Request("pay", src, -(amount + fee), rid, granted, declined)]


def settle_fn(ev: dict[str, Any]) -> list[Any]:
    out: list[Any] = [("statement_lines", (ev["account"],), 1)]
    if ev["type"] == "incoming":
        out.append(("credits", (ev["account"],), ev["amount"]))
    return out


def setup(dsn: str) -> tuple[Coordinator, EventLog]:
    query(dsn, "CREATE TABLE accounts (account text PRIMARY KEY, opening bigint NOT NULL, overdraft bigint NOT NULL)")
    query(dsn, "INSERT INTO accounts VALUES " + ", ".join(f"('{a}', {o}, {d})" for a, (o, d) in ACCOUNTS.items())
          + ", ('fees', 0, 0)")
    coord = Coordinator(dsn)
    requests = EventLog(dsn, "requests")
    requests.create(4)
    EventLog(dsn, "ledger").create(3)
    coord.register(settlement())  # keeps the credits the headroom adds: a view over its table ...
    query(dsn, "CREATE VIEW headroom AS SELECT a.account, a.opening + a.overdraft + coalesce(c.value, 0) AS value "
               "FROM accounts a LEFT JOIN credits c USING (account)")
    coord.register(payments())  # ... must exist before the decision is registered
    return coord, requests


def send(log: EventLog, reqs: list[dict[str, Any]]) -> None:
    """Producers append each request to its source account's partition."""
    for r in reqs:
        log.append([(r["id"], json.dumps(r))], partition=partition_of(str(r["from"]), 4))


def requests(n: int, seed: int, start: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    names = list(ACCOUNTS)
    out = []
    for i in range(start, start + n):
        src, dst = rng.sample(names, 2)
        out.append({"id": f"r{i}", "from": src, "to": dst, "amount": rng.choice([5, 20, 60, 120, 160, 300])})
    return out


def drain(coord: Coordinator, topology_id: str, fn: Any, tag: str) -> None:
    for n in range(1000):
        txn = coord.plan(topology_id, f"{tag}{n}")
        if not txn.empty:
            process_batch(coord, topology_id, txn.txid, fn)
        coord.commit(topology_id, txn.txid)
        if txn.empty:
            return


def check_invariants(dsn: str, sent: list[dict[str, Any]]) -> dict[str, bool]:
    """The payments invariants, from the producers' ledger (``sent``) and the committed state;
    the verdict on every request."""
    valid = [r for r in sent if r["from"] in ACCOUNTS and r["to"] in ACCOUNTS and r["from"] != r["to"]
             and isinstance(r["amount"], int) and r["amount"] > 0]
    verdicts = dict(query(dsn, "SELECT request_id, granted FROM airflow_txn.verdicts WHERE decision = 'pay'"))
    assert sorted(verdicts) == sorted({r["id"] for r in valid})  # every request decided exactly once
    # No account was ever below its limit at a commit: every balance after a grant is in bounds.
    assert query(dsn, "SELECT count(*) FROM airflow_txn.verdicts WHERE granted AND balance_after < 0") == [(0,)]
    ledger = [json.loads(p) for (p,) in query(dsn, "SELECT payload FROM airflow_txn.log_events "
                                                  "WHERE log_name = 'ledger'")]
    by_type: dict[str, list[str]] = defaultdict(list)
    for ev in ledger:
        by_type[ev["type"] if ev["account"] != "fees" else "fee"].append(ev["request"])
    granted = sorted(r for r, g in verdicts.items() if g)
    assert sorted(by_type["outgoing"]) == granted and sorted(by_type["incoming"]) == granted  # exactly once each
    assert sorted(by_type["declined"]) == sorted(r for r, g in verdicts.items() if not g)
    assert sorted(by_type["fee"]) == sorted(r["id"] for r in valid if verdicts[r["id"]] and r["amount"] > FEE_OVER)
    # Money is conserved (both stages drained): every balance is opening + credits + debits.
    balances = dict(query(dsn, "SELECT a.account, a.opening + coalesce(c.value, 0) + coalesce(d.value, 0) "
                               "FROM accounts a LEFT JOIN credits c USING (account) "
                               "LEFT JOIN debits d USING (account)"))
    assert sum(balances.values()) == sum(o for o, _d in ACCOUNTS.values())
    assert all(balances[a] >= -d for a, (_o, d) in ACCOUNTS.items())  # and none below its limit now
    return verdicts


def test_payments_are_decided_in_log_order_on_committed_balances_and_conserve_money(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    coord, log = setup(dsn)
    first = requests(120, seed=1)
    send(log, [*first, {"id": "bad", "from": "a1", "to": "a1", "amount": 5}])
    drain(coord, "payments", pay_fn, "p")
    # No credit was settled yet: the verdicts are those of a sequential executor on the openings.
    balance = {a: o + d for a, (o, d) in ACCOUNTS.items()}
    expected = {}
    for r in first:  # per source account, log order is send order
        cost = r["amount"] + (FEE if r["amount"] > FEE_OVER else 0)
        expected[r["id"]] = balance[r["from"]] - cost >= 0
        balance[r["from"]] -= cost if expected[r["id"]] else 0
    assert dict(query(dsn, "SELECT request_id, granted FROM airflow_txn.verdicts")) == expected
    assert 0 < sum(expected.values()) < len(expected)  # the data makes both verdicts happen
    assert query(dsn, "SELECT reason FROM airflow_txn.quarantine")[0][0].startswith("ValueError: unknown or same")
    # Settled credits raise the headroom of later payments; stages now interleave.
    second = requests(150, seed=2, start=1000)
    for k in range(0, 150, 30):
        drain(coord, "settlement", settle_fn, f"s{k}-")
        send(log, second[k:k + 30])
        drain(coord, "payments", pay_fn, f"q{k}-")
    drain(coord, "settlement", settle_fn, "s-end")
    verdicts = check_invariants(dsn, first + second)
    assert sum(verdicts[r["id"]] for r in second) > sum(expected[r["id"]] for r in first) / 120 * 150 * 0.5
    assert coord.verdicts("payments", "pay", ["r0", "nope"]).keys() == {"r0"}
    # What a requester asks: the CLI names each verdict, and exits 4 while one is still undecided.
    assert cli(["--dsn", dsn, "verdict", "payments", "pay", "r0", "r1", "nope"]) == 4
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"r0: {'granted' if verdicts['r0'] else 'declined'} in txid 1 (amount ")
    assert out[2] == "nope: not decided yet"
    assert cli(["--dsn", dsn, "verdict", "payments", "pay", "r0"]) == 0
    with pytest.raises(SystemExit):  # regression: an empty id was "not decided yet"
        cli(["--dsn", dsn, "verdict", "payments", "pay", ""])
    assert "a request id is non-empty text" in capsys.readouterr().err


def test_a_request_sent_again_is_not_decided_again_and_replays_decide_once(dsn: str) -> None:
    coord, log = setup(dsn)
    reqs = requests(40, seed=3)
    send(log, reqs)
    txn = coord.plan("payments", "a")
    for _ in range(2):  # two attempts; only the committed one's requests are decided
        process_batch(coord, "payments", txn.txid, pay_fn)
    with faults.inject("commit.after_append", "raise"), pytest.raises(faults.InjectedFault):
        coord.commit("payments", txn.txid)
    assert query(dsn, "SELECT count(*) FROM airflow_txn.verdicts") == [(0,)]  # rolled back with the commit
    assert query(dsn, "SELECT count(*) FROM debits") == [(0,)]
    coord.commit("payments", txn.txid)
    decided = dict(query(dsn, "SELECT request_id, txid FROM airflow_txn.verdicts"))
    # The same requests again under new event ids (a client retrying): nothing is decided twice.
    log.append([(f"again-{r['id']}", json.dumps(r)) for r in reqs[:10]])
    drain(coord, "payments", pay_fn, "b")
    after = dict(query(dsn, "SELECT request_id, txid FROM airflow_txn.verdicts"))
    assert len(decided) == 25 and sorted(after) == sorted(r["id"] for r in reqs)
    assert {r: after[r] for r in decided} == decided and min(t for r, t in after.items() if r not in decided) > 1
    drain(coord, "settlement", settle_fn, "s")
    check_invariants(dsn, reqs)


def sequential(sent: list[dict[str, Any]]) -> dict[str, tuple[bool, int]]:
    """The oracle without settlement: one executor deciding in log order from each account's
    opening plus overdraft -- (granted, balance after) by request id, a request sent again skipped."""
    balance = {a: o + d for a, (o, d) in ACCOUNTS.items()}
    out: dict[str, tuple[bool, int]] = {}
    for r in sent:
        if r["id"] not in out:
            cost = r["amount"] + (FEE if r["amount"] > FEE_OVER else 0)
            granted = balance[r["from"]] - cost >= 0
            balance[r["from"]] -= cost if granted else 0
            out[r["id"]] = (granted, balance[r["from"]])
    return out


def test_pipelined_txids_and_an_attempt_recorded_only_at_its_commit_decide_as_one_executor(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    coord, log = setup(dsn)
    reqs = requests(75, seed=6)
    send(log, reqs[:25])
    first = coord.plan("payments", "a")
    again = reqs[3]  # sent again, and its account has other requests in the next txid
    assert any(r["from"] == again["from"] for r in reqs[25:49])
    log.append([(f"again-{again['id']}", json.dumps(again))], partition=partition_of(again["from"], 4))
    send(log, reqs[25:49])
    second = coord.plan("payments", "b")
    # The second txid completes first: it records its requests before the first one is decided,
    # so its commit takes the request sent again out of its account's run then.
    process_batch(coord, "payments", second.txid, pay_fn)
    process_batch(coord, "payments", first.txid, pay_fn)
    coord.commit("payments", first.txid)
    coord.commit("payments", second.txid)
    assert query(dsn, "SELECT requests IS NOT NULL AND NOT %s = ANY(requests) FROM airflow_txn.decision_runs "
                      "WHERE txid = %s AND key = jsonb_build_array(%s::text)",
                 (again["id"], second.txid, again["from"])) == [(True,)]
    # An attempt that completed without recording its requests (an older version of the
    # provider did not) has them recorded by its commit.
    send(log, reqs[49:])
    with monkeypatch.context() as m:
        m.setattr(decisions, "prepare", lambda *args, **kwargs: None)
        third = coord.plan("payments", "c")
        process_batch(coord, "payments", third.txid, pay_fn)
    assert query(dsn, "SELECT count(*) FROM airflow_txn.decision_requests WHERE txid = %s", (third.txid,)) == [(0,)]
    coord.commit("payments", third.txid)
    drain(coord, "payments", pay_fn, "d")
    got = {r: (g, int(b)) for r, g, b in query(dsn, "SELECT request_id, granted, balance_after "
                                                    "FROM airflow_txn.verdicts")}
    assert got == sequential([*reqs[:25], again, *reqs[25:]])
    assert 0 < sum(g for g, _b in got.values()) < len(got)
    # Every way of deciding a key's run ran: granted whole, every debit declined, the loop.
    assert query(dsn, "SELECT count(*) FILTER (WHERE requests IS NULL AND debits_declined IS NOT TRUE) > 0, "
                      "count(*) FILTER (WHERE debits_declined) > 0, count(*) FILTER (WHERE grants IS NOT NULL) > 0 "
                      "FROM airflow_txn.decision_runs") == [(True, True, True)]
    assert query(dsn, "SELECT txid FROM airflow_txn.verdicts WHERE request_id = %s", (again["id"],)) == [(1,)]
    drain(coord, "settlement", settle_fn, "s")
    check_invariants(dsn, reqs)


def test_a_request_left_out_for_an_earlier_txid_is_put_back_when_that_txid_commits_without_it(dsn: str) -> None:
    coord, log = setup(dsn)
    reqs = requests(75, seed=7)
    held, kept = reqs[3], reqs[5]  # both sent again; the first txid's committed attempt holds one back

    def again(req: dict[str, Any], tag: str) -> None:
        log.append([(f"{tag}-{req['id']}", json.dumps(req))], partition=partition_of(req["from"], 4))

    def holding_back(req: dict[str, Any]) -> list[Any]:
        if req["id"] == held["id"]:
            raise ValueError("held back")
        return pay_fn(req)

    send(log, reqs[:25])
    first = coord.plan("payments", "a")
    again(held, "again")
    again(kept, "again")
    send(log, reqs[25:48])
    second = coord.plan("payments", "b")
    again(held, "again2")
    send(log, reqs[48:72])
    third = coord.plan("payments", "c")
    # Completions in txid order, all before the first commit: the second leaves both requests
    # out for now, as the first claims them.
    process_batch(coord, "payments", first.txid, pay_fn)
    process_batch(coord, "payments", second.txid, pay_fn)
    assert sorted(r for (r,) in query(dsn, "SELECT request_id FROM airflow_txn.decision_conflicts "
                                           "WHERE txid = %s", (second.txid,))) == sorted([held["id"], kept["id"]])
    # The first txid's committed attempt holds one back (quarantined), after the second completed.
    process_batch(coord, "payments", first.txid, holding_back)
    coord.commit("payments", first.txid)
    # The third completes now: the request the second left out is still claimed by it, so the
    # third leaves it out too, until the second's commit has settled it.
    process_batch(coord, "payments", third.txid, pay_fn)
    coord.commit("payments", second.txid)
    coord.commit("payments", third.txid)
    send(log, reqs[72:])
    drain(coord, "payments", pay_fn, "d")
    got = {r: (g, int(b)) for r, g, b in query(dsn, "SELECT request_id, granted, balance_after "
                                                    "FROM airflow_txn.verdicts")}
    assert got == sequential([*(r for r in reqs[:25] if r is not held), held, kept, *reqs[25:]])
    assert dict(query(dsn, "SELECT request_id, txid FROM airflow_txn.verdicts WHERE request_id = ANY(%s)",
                      ([held["id"], kept["id"]],))) == {held["id"]: second.txid, kept["id"]: first.txid}
    drain(coord, "settlement", settle_fn, "s")
    check_invariants(dsn, reqs)


def test_credits_and_debits_decided_per_key_as_one_executor_whichever_way_each_run_is_decided(dsn: str) -> None:
    # Requests staged as a processing attempt stages them, credits among the debits, balances
    # driven to the floor and back: each key's run is granted whole, has every debit declined
    # (with the credits before each still granted), or is decided one by one.
    EventLog(dsn, "ticks").create(1)
    EventLog(dsn, "ticks").append([(f"t{i}", "{}") for i in range(12)])
    coord = Coordinator(dsn)
    coord.register(TopologySpec("wallets", PostgresLogSource("ticks"), [StateSpec("funds", {"w": "text"})],
                                decisions=[DecisionSpec("spend", state="funds", floor=-30)], max_batch_size=1))
    rng = random.Random(5)
    balance: dict[str, int] = defaultdict(int)
    expected: dict[str, tuple[bool, int]] = {}
    for t in range(12):
        credit = 45 if t % 4 == 3 else 15  # every fourth txid refills
        reqs = [(f"w{rng.randrange(6)}", rng.choice([-20, -10, -5, credit])) for _ in range(40)]
        txn = coord.plan("wallets", f"t{t}")
        attempt, txn = attempts.begin_attempt(coord.store, "wallets", txn.txid)
        if t == 8:  # an attempt that staged and was lost: a later completion clears its requests
            coord.stage_requests(attempt, "spend", [(("w0",), 0, "lost", -1)])
            attempt, txn = attempts.begin_attempt(coord.store, "wallets", txn.txid)
        staged = coord.stage_requests(attempt, "spend", (((w,), seq, f"q{t}-{seq}", a)
                                                         for seq, (w, a) in enumerate(reqs)))
        attempts.finish_attempt(coord.store, attempt, {"spend": staged}, records_read=1)
        coord.commit("wallets", txn.txid)
        for seq, (w, a) in enumerate(reqs):
            granted = a >= 0 or balance[w] + a >= -30
            balance[w] += a if granted else 0
            expected[f"q{t}-{seq}"] = (granted, balance[w])
    coord.close()
    got = {r: (g, int(b)) for r, g, b in query(dsn, "SELECT request_id, granted, balance_after "
                                                    "FROM airflow_txn.verdicts")}
    assert got == expected
    assert {w: v for w, v in query(dsn, "SELECT w, value FROM funds") if v} == {w: b for w, b in balance.items() if b}
    [(staging,)] = query(dsn, "SELECT tablename FROM pg_tables WHERE tablename LIKE 'requests_%%_spend'")
    assert query(dsn, f"SELECT count(*) FROM airflow_txn.{staging}") == [(0,)]
    assert query(dsn, "SELECT count(*) FILTER (WHERE requests IS NULL AND debits_declined IS NOT TRUE) > 0, "
                      "count(*) FILTER (WHERE debits_declined) > 0, count(*) FILTER (WHERE grants IS NOT NULL) > 0 "
                      "FROM airflow_txn.decision_runs") == [(True, True, True)]


@pytest.mark.parametrize("others", [0, 3])  # alone in its run (the fast ways), or among others (the loop)
def test_a_credit_that_would_carry_a_balance_past_its_type_is_declined_not_the_commit(dsn: str, others: int) -> None:
    """A grant adds to a bigint balance: one credit near the top, then any other, would overflow the
    commit's arithmetic on every try. A balance stays within what its type holds, as it stays above
    its floor: the credit that would carry it past the top is declined; the rest is decided as ever."""
    EventLog(dsn, "ticks").create(1)
    EventLog(dsn, "ticks").append([(f"t{i}", "{}") for i in range(3)])
    coord = Coordinator(dsn)
    coord.register(TopologySpec("wallets", PostgresLogSource("ticks"), [StateSpec("funds", {"w": "text"})],
                                decisions=[DecisionSpec("spend", state="funds", floor=-30)], max_batch_size=1))
    top = 2**63 - 1
    batches = [[("a", top - 10)], [*[("b", 1)] * others, ("a", 100), ("a", -5), ("a", 3), ("a", 20)],
               [("a", 13), ("a", 12)]]
    for t, reqs in enumerate(batches):
        txn = coord.plan("wallets", f"t{t}")
        attempt, txn = attempts.begin_attempt(coord.store, "wallets", txn.txid)
        staged = coord.stage_requests(attempt, "spend", (((w,), seq, f"q{t}-{seq}", a)
                                                         for seq, (w, a) in enumerate(reqs)))
        attempts.finish_attempt(coord.store, attempt, {"spend": staged}, records_read=1)
        assert coord.commit("wallets", txn.txid).committed
    verdicts = {r: v["granted"] for r, v in coord.verdicts("wallets", "spend", [
        f"q{t}-{n}" for t, reqs in enumerate(batches) for n in range(len(reqs))]).items()}
    a = [f"q1-{others + n}" for n in range(4)]
    assert [verdicts[r] for r in a] == [False, True, True, False]  # +100 and +20 would pass the top
    assert verdicts["q0-0"] and [verdicts["q2-0"], verdicts["q2-1"]] == [False, True]  # at top - 12: 13 is one too many
    assert dict(query(dsn, "SELECT w, value FROM funds"))["a"] == top
    coord.close()


def test_decisions_are_declared_on_a_sum_state_they_alone_update(dsn: str) -> None:
    source = PostgresLogSource("requests")
    with pytest.raises(ConfigError, match="must be a transactional sum state"):
        TopologySpec("t", source, [StateSpec("d", {"k": "text"}, combiner="max")],
                     decisions=[DecisionSpec("pay", state="d")])
    with pytest.raises(ConfigError, match="has no state 'nope'"):
        TopologySpec("t", source, [StateSpec("d", {"k": "text"})], decisions=[DecisionSpec("pay", state="nope")])
    with pytest.raises(ConfigError, match="decision names must be unique and differ"):
        TopologySpec("t", source, [StateSpec("d", {"k": "text"})], decisions=[DecisionSpec("d", state="d")])
    coord, log = setup(dsn)
    send(log, requests(3, seed=4))
    txn = coord.plan("payments", "a")
    with pytest.raises(ConfigError, match="updated by a decision only"):
        process_batch(coord, "payments", txn.txid, lambda r: [("debits", (r["from"],), 5)])
    # A request whose amount is not a number is a bad record: quarantined, the rest decided.
    bad = process_batch(coord, "payments", txn.txid, lambda r: [Request("pay", r["from"], "lots", r["id"])])
    assert bad.quarantined == 3 and bad.row_counts["pay"] == 0
    assert "amount must be a number, got 'lots'" in query(dsn, "SELECT reason FROM airflow_txn.quarantine")[0][0]
    query(dsn, "DROP VIEW headroom")
    process_batch(coord, "payments", txn.txid, pay_fn)
    with pytest.raises(ConfigError, match=r"headroom 'public.headroom' does not exist: create it"):
        coord.commit("payments", txn.txid)
    with pytest.raises(ConfigError, match=r"or register the topology whose state table it is first"):
        Coordinator(dsn).register(payments())
