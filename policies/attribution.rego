# Attribution completeness: which physical GPU served each transaction must be known.
#
# Facts (collector/policy/facts.py): input.attribution =
#   {records, exact, ambiguous, unattributed, pending,
#    unattributed_records[]: {record_id, transaction_id, event_time_ns, reason, pod_namespace, pod_name}}
# counted over the inference records of the period (pending = not attributed yet).
package draudit.attribution

import data.draudit.lib

# Rule 6a: the share of transactions attributed exactly is below the threshold.
findings contains f if {
	a := input.attribution
	a.records > 0
	a.exact < lib.params.exact_attribution_min_ratio * a.records
	f := {
		"rule": "attribution/exact-ratio",
		"severity": "medium",
		"kind": "warning",
		"message": sprintf("%d of %d transactions were attributed exactly to a physical GPU (%d ambiguous, %d unattributed, %d pending), below the required ratio %v", [
			a.exact, a.records, a.ambiguous, a.unattributed, a.pending, lib.params.exact_attribution_min_ratio,
		]),
		"subjects": {"cluster": input.period.cluster},
		"evidence": {"counts": {"records": a.records, "exact": a.exact, "ambiguous": a.ambiguous, "unattributed": a.unattributed, "pending": a.pending}},
		"physical_gpu_uuid": null,
		# A share of the period's transactions has no interval of its own: not an incident that
		# windows merge, a statement about the evaluated period (a pack shows the evaluation
		# that covered the most of its period).
		"from_ns": null,
		"to_ns": null,
	}
}

# Rule 6b: each unattributed transaction.
findings contains f if {
	some r in input.attribution.unattributed_records
	f := {
		"rule": "attribution/unattributed-transaction",
		"severity": "medium",
		"kind": "warning",
		"message": sprintf("transaction %s could not be attributed to a physical GPU (%v)", [r.transaction_id, r.reason]),
		"subjects": {"transactions": [r.transaction_id]},
		"evidence": {"inference_records": [r.record_id]},
		"physical_gpu_uuid": null,
		"from_ns": r.event_time_ns,
		"to_ns": r.event_time_ns,
	}
}
