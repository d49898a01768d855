"""Declarations fail early, with a message that names the fix."""

from __future__ import annotations

import pytest

from airflow_transactional import get_provider_info, identifiers
from airflow_transactional.connections import redact
from airflow_transactional.core.redeclaration import incompatible_changes
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.sources import LandingDirectory, PostgresLogSource, source_from_config
from airflow_transactional.spec import DecisionSpec, OutputSpec, SparkJob, StateSpec, TopologySpec

pytestmark = pytest.mark.unit


def _spec(**kw):  # type: ignore[no-untyped-def]
    args = {"topology_id": "t1", "source": PostgresLogSource("events"),
            "states": [StateSpec("counts", {"k": "text"})]}
    args.update(kw)
    return TopologySpec(**args)


@pytest.mark.parametrize("bad", ["Words", "1abc", "a-b", "a;drop table x", "", "x" * 41, None])
def test_topology_id_rule_is_stated(bad: object) -> None:
    with pytest.raises(ConfigError, match="lower-case letters, digits and '_'"):
        _spec(topology_id=bad)


def test_sql_injection_in_names_is_refused_everywhere() -> None:
    with pytest.raises(ConfigError):
        StateSpec("counts", {"k; DROP TABLE x": "text"})
    with pytest.raises(ConfigError):
        StateSpec("counts", {"k": "text); DROP TABLE x; --"})
    with pytest.raises(ConfigError):
        StateSpec("counts", {"k": "text"}, table='public."x"')
    with pytest.raises(ConfigError):
        PostgresLogSource("ev'ents")


def test_reserved_column_names_are_refused_with_the_list() -> None:
    with pytest.raises(ConfigError, match="reserved for the provider"):
        StateSpec("counts", {"txid": "bigint"})


def test_numeric_combiner_needs_numeric_value() -> None:
    with pytest.raises(ConfigError, match="needs a numeric value_type"):
        StateSpec("counts", {"k": "text"}, combiner="sum", value_type="text")
    assert StateSpec("latest", {"k": "text"}, combiner="replace", value_type="text").value_type == "text"


def test_limits_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="max_in_flight must be an integer from 1 to 100,000"):
        _spec(max_in_flight=0)
    with pytest.raises(ConfigError, match="on_bad_record must be 'quarantine' or 'fail'"):
        _spec(on_bad_record="drop")


def test_duplicate_states_are_refused() -> None:
    with pytest.raises(ConfigError, match="state names must be unique"):
        _spec(states=[StateSpec("a", {"k": "text"}), StateSpec("a", {"k": "text"}, table="b")])
    with pytest.raises(ConfigError, match="two states write the same table"):
        _spec(states=[StateSpec("a", {"k": "text"}), StateSpec("b", {"k": "text"}, table="public.a")])


def test_spec_round_trips_through_its_stored_config() -> None:
    spec = _spec(states=[StateSpec("counts", {"k": "text", "day": "date"}, kind="opaque", combiner="max")],
                 opaque=True, max_batch_size=7)
    assert TopologySpec.from_config(spec.to_config()) == spec
    landing = LandingDirectory("/data/in", format="parquet", max_files=3)
    assert source_from_config(landing.to_config()).to_config() == landing.to_config()
    capped = LandingDirectory("s3a://bucket/in", max_batch_bytes=5 << 30)
    assert source_from_config(capped.to_config()).to_config() == capped.to_config()
    assert capped.to_config()["max_batch_bytes"] == 5 << 30 and "max_batch_bytes" not in landing.to_config()
    # The caps and the way a plan lists shape future batches only: a topology may change them.
    tuned = _spec(source=LandingDirectory("s3a://bucket/in", max_batch_bytes=1 << 30, max_files=7,
                                          listing="incremental", full_listing_seconds=60))
    assert incompatible_changes(_spec(source=capped).to_config(), tuned.to_config()) == []
    assert incompatible_changes(_spec(source=capped).to_config(),
                                _spec(source=LandingDirectory("s3a://bucket/other")).to_config())


def test_outputs_are_checked_and_round_trip() -> None:
    spec = _spec(outputs=[OutputSpec("granted", partitions=4), OutputSpec("declined", log="decisions")])
    assert TopologySpec.from_config(spec.to_config()) == spec
    assert [o.log_name for o in spec.outputs] == ["granted", "decisions"]
    assert "outputs" not in _spec().to_config()  # declarations without outputs are stored as before
    with pytest.raises(ConfigError, match="differ from the state names"):
        _spec(outputs=[OutputSpec("counts")])
    with pytest.raises(ConfigError, match="output names must be unique"):
        _spec(outputs=[OutputSpec("a"), OutputSpec("a", log="b")])
    with pytest.raises(ConfigError, match="two outputs append to the same log"):
        _spec(outputs=[OutputSpec("a", log="x"), OutputSpec("b", log="x")])
    with pytest.raises(ConfigError, match="reads log 'events' and appends to it"):
        _spec(outputs=[OutputSpec("out", log="events")])
    with pytest.raises(ConfigError, match="outputs must be OutputSpec"):
        _spec(outputs=["granted"])
    with pytest.raises(ConfigError, match="outputs must be a list"):
        _spec(outputs=OutputSpec("a"))
    for bad in (0, 5000, "2", True):
        with pytest.raises(ConfigError, match="partitions must be an integer from 1 to 1024"):
            OutputSpec("o", partitions=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid output name"):
        OutputSpec("Bad-Name")
    for bad in ("0", None, True):
        with pytest.raises(ConfigError, match="floor must be a finite number"):
            DecisionSpec("pay", state="debits", floor=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid table name"):
        DecisionSpec("pay", state="debits", headroom="a.b.c")
    with pytest.raises(ConfigError, match="two decisions update the same state"):
        _spec(decisions=[DecisionSpec("a", state="counts"), DecisionSpec("b", state="counts")])
    # Adding an output changes nothing committed; moving or dropping one does.
    plain, one = _spec().to_config(), _spec(outputs=[OutputSpec("o")]).to_config()
    assert incompatible_changes(plain, one) == []
    assert incompatible_changes(one, plain) == ["output 'o' (log 'o') removed"]
    assert incompatible_changes(one, _spec(outputs=[OutputSpec("o", log="p")]).to_config()) == [
        "output 'o' (log 'o') now appends to 'p'"]


def test_landing_directory_must_be_absolute() -> None:
    with pytest.raises(ConfigError, match="absolute path"):
        LandingDirectory("data/in")


def test_types_are_canonical_and_limited() -> None:
    assert identifiers.sql_type("INT8") == "bigint"
    assert identifiers.sql_type("timestamptz") == "timestamp with time zone"
    with pytest.raises(ConfigError, match="unsupported column type"):
        identifiers.sql_type("jsonb")


@pytest.mark.parametrize(("dsn", "expected"), [
    ("postgresql://app:s3cr3t@db:5432/x", "postgresql://app:***@db:5432/x"),
    ("host=db user=app password=s3cr3t dbname=x", "host=db user=app password=*** dbname=x"),
    ("host=db password='a b\\'c' dbname=x", "host=db password=*** dbname=x"),
    ("postgresql://app@db/x", "postgresql://app@db/x"),
])
def test_redact_removes_passwords(dsn: str, expected: str) -> None:
    assert redact(dsn) == expected


def test_provider_info_names_the_package() -> None:
    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-transactional"
    assert info["versions"]


@pytest.mark.parametrize(("given", "message"), [
    ({"job": {"application": "job.py"}}, r"job must be a SparkJob, got \{'application'"),
    ({"dag_id": ""}, "dag_id must be a DAG id, got ''"),
    ({"stall_after_seconds": 0}, "stall_after_seconds must be a positive number of seconds, got 0"),
    ({"stall_after_seconds": True}, "stall_after_seconds must be a positive number of seconds, got True"),
])
def test_a_bad_job_dag_id_or_stall_rule_is_refused_naming_the_field(given: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _spec(**given)


@pytest.mark.parametrize(("given", "message"), [
    ({"application": ""}, "application must be a path, got ''"),
    ({"application": "job.py", "application_args": "--flag"}, "application_args must be a list of strings"),
    ({"application": "job.py", "py_files": ["a.py"]}, r"py_files must be comma-separated paths, got \['a.py'\]"),
])
def test_a_bad_spark_job_is_refused_naming_the_field(given: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SparkJob(**given)
    assert SparkJob("job.py", ["--x"], "a.py,b.py").to_config() == {
        "application": "job.py", "application_args": ["--x"], "py_files": "a.py,b.py"}
