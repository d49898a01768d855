"""The action pages of the Transactions view: what clearing a run or reprocessing the failed runs
will do (a preview first) with the button that does it, and why an action was refused."""

from __future__ import annotations

from typing import Any

from .pages import dag_path, e, page, run_path, table, when


def confirm_form(action: str, token: str, label: str) -> str:
    """The button that does an action, with the form token its preview was made with."""
    return (f"<form method=post action='{action}'><input type=hidden name=token value='{e(token)}'>"
            f"<button type=submit class=confirm>{e(label)}</button></form>")


def clear_preview(base: str, plan: Any, token: str) -> str:
    """What clearing a run's failed tasks will do (Airflow's dry run), and the button that does it."""
    here = f"{e(base)}{run_path(plan.dag_id, plan.run_id)}"
    tasks = table(["task", "state now"], [[e(t["task_id"]), e(t["state"])] for t in plan.tasks])
    later = ""
    if plan.blocked_after:
        later = (f"<p>Failed runs after it stay failed: txids {', '.join(str(t) for t in plan.blocked_after)}. "
                 f"Clear each of them too, or <a href='{e(base)}{dag_path(plan.dag_id)}/reprocess'>reprocess all "
                 "the failed runs</a> in one backfill.</p>")
    title = f"txid {plan.txid}" if plan.txid is not None else "no txid yet"
    body = (f"<h1>Clear run {e(plan.run_id)} ({e(title)})</h1>"
            f"<p>{e(plan.effect)}</p>"
            + (f"<h2>Airflow will clear these task instances</h2>{tasks}{later}"
               + confirm_form(f"{here}/clear", token, f"Clear {len(plan.tasks)} task instance(s)")
               if plan.tasks else "")
            + f"<p><a href='{here}'>Back to the run</a></p>")
    return page(f"Clear {plan.run_id}", body)


def reprocess_preview(base: str, plan: Any, token: str) -> str:
    """The "reprocess failed" backfill Airflow would run over the blocked range, run by run."""
    back = f"<p><a href='{e(base)}{dag_path(plan.dag_id)}'>Back to the topology</a></p>"
    undated = ("<p>Failed runs a backfill cannot reach (no logical date, or one off the DAG's schedule): clear "
               "them one by one: "
               + ", ".join(f"<a href='{e(base)}{run_path(plan.dag_id, r)}'>{e(r)}</a>" for r in plan.unreachable)
               + "</p>") if plan.unreachable else ""
    if plan.problem:
        return page("Nothing to reprocess", f"<h1>Reprocess failed runs of {e(plan.dag_id)}</h1>"
                                            f"<p class=blocked>{e(plan.problem)}</p>{undated}{back}")
    rows = [[when(r["logical_date"]), e(r["run_id"]) if r["run_id"] else "(new run)",
             "-" if r["txid"] is None else str(r["txid"]), e(r["effect"])] for r in plan.runs]
    body = (f"<h1>Reprocess failed runs of {e(plan.dag_id)}</h1>"
            f"<p>A backfill with <b>reprocess failed</b> from {when(plan.from_date)} to {when(plan.to_date)}, at most "
            f"{plan.max_active_runs} runs at once. Airflow will run:</p>"
            + table(["logical date", "run", "txid", "what happens"], rows, numeric=(2,))
            + "<p class=muted>Every txid still commits once, in txid order: a committed batch is never counted "
              "again.</p>" + undated
            + confirm_form(f"{e(base)}{dag_path(plan.dag_id)}/reprocess", token,
                           f"Start the backfill ({len(rows)} runs)")
            + back)
    return page(f"Reprocess {plan.dag_id}", body)


def refused(base: str, status: int, detail: str) -> str:
    """Why an action page cannot be shown or done, in words (escaped), and the way back."""
    return page("Not done", f"<h1>Not done ({int(status)})</h1><p class=blocked>{e(detail)}</p>"
                            f"<p><a href='{e(base)}/'>Back to Transactions</a></p>")
