"""Stage 1 of the payments pipeline: the payment executor of "Online Event Processing" (Figure 3).

Payment requests arrive on a log partitioned by source account. This job validates them in
parallel (a bad one is quarantined with its reason) and turns each into a request for the
``pay`` decision: take ``amount`` (plus a fee on big payments) from the source account. The
commit decides the requests one by one per account, in log order, on the committed balance; only
then are the ledger events of a granted payment appended -- outgoing from the payer, incoming to
the payee and to the fees account -- or the declined event of a refused one. Every event carries
the request id.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from airflow_transactional.spark_job import run

FEE_OVER, FEE = 1_000, 5  # a payment over FEE_OVER costs its payer FEE more, paid to the fees account
MOST = 1_000_000_000  # the largest payment: a bound every record is checked against before any arithmetic
FEES_ACCOUNT = "fees"


def ledger_event(requests: DataFrame, kind: str, account: Column, amount: Column, when: str) -> DataFrame:
    """One ledger event per request, appended only if the request is ``when`` (granted or declined)."""
    payload = F.struct(F.lit(kind).alias("type"), F.col("id").alias("request"), account.alias("account"),
                       amount.alias("amount"))
    return requests.select(F.concat("id", F.lit(f":{kind}")).alias("id"), account.alias("key"),
                           payload.alias("payload"), "seq", F.col("id").alias("request"), F.lit(when).alias("when"))


def transform(requests: DataFrame) -> dict[str, DataFrame]:
    reqs = requests.select(
        "id", "amount", F.col("from").alias("src"), F.col("to").alias("dst"),
        F.when(F.col("amount") > FEE_OVER, F.lit(FEE)).otherwise(F.lit(0)).alias("fee"),
        F.split("_offset", ":").getItem(1).cast("long").alias("seq"))  # log order within the payer's partition
    ledger = (ledger_event(reqs, "outgoing", F.col("src"), F.col("amount") + F.col("fee"), "granted")
              .unionByName(ledger_event(reqs, "incoming", F.col("dst"), F.col("amount"), "granted"))
              .unionByName(ledger_event(reqs.where("fee > 0"), "fee", F.lit(FEES_ACCOUNT), F.col("fee"), "granted"))
              .unionByName(ledger_event(reqs, "declined", F.col("src"), F.col("amount"), "declined")))
    return {
        "pay": reqs.select(F.col("src").alias("account"), (-(F.col("amount") + F.col("fee"))).alias("amount"),
                           "id", "seq"),
        "requests_seen": reqs.select(F.col("src").alias("account"), F.lit(1).alias("value")),
        "ledger": ledger,
    }


SCHEMA = "id string, `from` string, `to` string, amount bigint"
REQUIRED = ["id", "from", "to", "amount"]
CHECKS = {"amount must be a positive number": "amount > 0",
          f"amount must be at most {MOST:,}": f"amount <= {MOST}",
          "a payment needs two different accounts": "`from` <> `to`"}

if __name__ == "__main__":
    raise SystemExit(run(transform, schema=SCHEMA, required=REQUIRED, checks=CHECKS))
