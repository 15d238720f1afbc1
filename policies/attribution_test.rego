# Attribution completeness rules, told as short stories. Parameters are pinned here.
package draudit.attribution_test

import data.draudit.attribution

params := {
	"tenants": {},
	"approved_device_classes": [],
	"admin_access_namespaces": [],
	"handover_min_gap_s": 300,
	"exact_attribution_min_ratio": 0.99,
	"coverage_gap_max_s": 60,
	"idle_allocation_max_s": 3600,
	"strict_mig": false,
}

period := {"from_ns": 1764403200000000000, "to_ns": 1764489600000000000, "cluster": "prod-eu-1"}

counts(exact, ambiguous, unattributed, pending, records) := {
	"records": exact + ambiguous + unattributed + pending, "exact": exact, "ambiguous": ambiguous,
	"unattributed": unattributed, "pending": pending, "unattributed_records": records,
}

rules(fs) := {f.rule | some f in fs}

test_all_transactions_attributed_exactly_is_fine if {
	fs := attribution.findings with input as {"period": period, "attribution": counts(1000, 0, 0, 0, [])}
		with data.draudit.params as params
	count(fs) == 0
}

test_exact_share_below_the_threshold_is_a_medium_finding if {
	fs := attribution.findings with input as {"period": period, "attribution": counts(980, 20, 0, 0, [])}
		with data.draudit.params as params
	rules(fs) == {"attribution/exact-ratio"}
	some f in fs
	f.severity == "medium"
	f.from_ns == null # about the whole evaluated period
	f.to_ns == null
	startswith(f.message, "980 of 1000 transactions")
}

test_exact_share_at_the_threshold_is_fine if {
	fs := attribution.findings with input as {"period": period, "attribution": counts(990, 10, 0, 0, [])}
		with data.draudit.params as params
	count(fs) == 0
}

test_a_period_without_transactions_has_no_attribution_finding if {
	fs := attribution.findings with input as {"period": period, "attribution": counts(0, 0, 0, 0, [])}
		with data.draudit.params as params
	count(fs) == 0
}

test_each_unattributed_transaction_is_a_medium_finding if {
	records := [
		{"record_id": 41, "transaction_id": "txn-7f3a", "event_time_ns": 1764410000000000000, "reason": "no-pod", "pod_namespace": null, "pod_name": null},
		{"record_id": 42, "transaction_id": "txn-7f3b", "event_time_ns": 1764410000500000000, "reason": "coverage-gap", "pod_namespace": "risk-inference", "pod_name": "fraud-0"},
	]
	fs := attribution.findings with input as {"period": period, "attribution": counts(5000, 0, 2, 0, records)}
		with data.draudit.params as params
	unattributed := [f | some f in fs; f.rule == "attribution/unattributed-transaction"]
	count(unattributed) == 2
	{f.subjects.transactions[0] | some f in unattributed} == {"txn-7f3a", "txn-7f3b"}
	every f in unattributed {
		f.severity == "medium"
	}
}
