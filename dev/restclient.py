"""A client of Airflow's REST API as the UI and scripts use it: a token from the simple auth
manager, DAG runs triggered, read, cleared and backfilled."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from airflow_transactional.exceptions import TransactionalError


class AirflowStackError(TransactionalError):
    """The local Airflow did not come up (the message names the component and its log)."""


class RestClient:
    """A minimal client of Airflow's public REST API (``/api/v2``), with a JWT from ``/auth/token``."""

    def __init__(self, url: str, username: str, password: str) -> None:
        self.url = url.rstrip("/")
        self._credentials = {"username": username, "password": password}
        self._token: str | None = None

    def _request(self, method: str, path: str, body: Any = None, auth: bool = True) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            raise AirflowStackError(f"{method} {path} -> {exc.code}: {detail}") from None
        return json.loads(raw) if raw else None

    def token(self) -> str:
        if self._token is None:
            self._token = str(self._request("POST", "/auth/token", self._credentials, auth=False)["access_token"])
        return self._token

    def get(self, path: str) -> Any:
        return self._request("GET", path, auth=not path.startswith("/api/v2/monitor"))

    def post(self, path: str, body: Any) -> Any:
        return self._request("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self._request("PATCH", path, body)

    # -- the calls the UI makes ------------------------------------------------------------

    def unpause(self, dag_id: str) -> None:
        self.patch(f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, logical_date: str | None, run_id: str | None = None,
                conf: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"logical_date": logical_date}
        if run_id:
            body["dag_run_id"] = run_id
        if conf is not None:
            body["conf"] = conf
        return dict(self.post(f"/api/v2/dags/{dag_id}/dagRuns", body))

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}"))

    def delete_run(self, dag_id: str, run_id: str) -> None:
        """Delete a (failed, queued or finished) run, as the UI's "Delete" does."""
        self._request("DELETE", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")

    def runs(self, dag_id: str, limit: int | None = None) -> list[dict[str, Any]]:
        """The DAG's runs, oldest first: all of them, or the first ``limit``.

        The API silently caps a page at ``[api] maximum_page_limit`` (100 by default), so this
        pages until ``total_entries`` runs are in hand."""
        runs: list[dict[str, Any]] = []
        while limit is None or len(runs) < limit:
            page = self.get(f"/api/v2/dags/{dag_id}/dagRuns?limit=100&offset={len(runs)}&order_by=id")
            runs += page["dag_runs"]
            if not page["dag_runs"] or len(runs) >= page["total_entries"]:
                break
        return runs if limit is None else runs[:limit]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return list(self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"])

    def clear(self, dag_id: str, run_id: str, task_ids: list[str] | None = None, *, only_failed: bool = False,
              **flags: bool) -> list[dict[str, Any]]:
        """Clear task instances of one run, as the UI's "Clear" does (flags: include_downstream, ...)."""
        body: dict[str, Any] = {"dry_run": False, "dag_run_id": run_id, "only_failed": only_failed,
                                "reset_dag_runs": True, **flags}
        if task_ids is not None:
            body["task_ids"] = task_ids
        return list(self.post(f"/api/v2/dags/{dag_id}/clearTaskInstances", body)["task_instances"])

    def backfill(self, dag_id: str, from_date: str, to_date: str, *, reprocess: str = "failed",
                 max_active_runs: int = 3) -> dict[str, Any]:
        """Create a backfill (``reprocess``: none, failed or completed), as the UI's dialog does."""
        return dict(self.post("/api/v2/backfills", {"dag_id": dag_id, "from_date": from_date, "to_date": to_date,
                                                    "reprocess_behavior": reprocess,
                                                    "max_active_runs": max_active_runs}))

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.get(f"/api/v2/dags/{dag_id}")
                return
            except AirflowStackError:
                time.sleep(2)
        raise AirflowStackError(f"DAG {dag_id} was not parsed in {timeout:.0f}s: check the dag-processor log")
