"""Inference-log ingestion: log lines → canonical inference records, quarantine, PAN masking.

Modules, in the order data flows through them:
``pipeline`` (runs, input streams, counts) → ``parser`` (one line → outcome) → ``envelopes``
(CRI, Fluent Bit, Fluentd, Vector, Filebeat, docker) → ``payloads`` (Spring ECS flat/nested,
logstash, GELF; alias mapping) / ``otlp`` (OTLP JSON and protobuf) → ``record`` (canonical record,
dedup key) → ``writer`` (batched inserts, conflicts, ledger). ``pan`` masks card numbers,
``jsondoc`` decodes hostile JSON safely, ``timestamps`` parses times to integer ns, ``aliases``
holds the configurable field-name table, ``http`` serves ``/v1/ingest`` and ``/v1/logs``,
``metrics`` the Prometheus counters.
"""
