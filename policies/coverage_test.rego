# Coverage rules, told as short stories. Parameters are pinned here.
package draudit.coverage_test

import data.draudit.coverage

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

gap(id, duration_s, open) := {
	"id": id, "cluster": "prod-eu-1", "kind": "ResourceClaim", "started_ns": 1764410000000000000,
	"ended_ns": null, "open": open, "duration_ns": duration_s * 1000000000,
	"from_ns": 1764410000000000000, "to_ns": 1764410000000000000 + duration_s * 1000000000, "reason": "watch stream lost",
}

test_a_watch_gap_longer_than_the_threshold_is_a_medium_finding if {
	fs := coverage.findings with input as {"coverage_gaps": [gap(17, 61, false)]} with data.draudit.params as params
	count(fs) == 1
	some f in fs
	f.rule == "coverage/observation-gap"
	f.severity == "medium"
	f.subjects == {"cluster": "prod-eu-1", "kinds": ["ResourceClaim"]}
	f.evidence == {"coverage_intervals": [17]}
}

test_a_short_watch_gap_is_tolerated if {
	fs := coverage.findings with input as {"coverage_gaps": [gap(17, 60, false)]} with data.draudit.params as params
	count(fs) == 0
}

test_a_gap_that_is_still_open_points_at_the_watch_state if {
	fs := coverage.findings with input as {"coverage_gaps": [gap(null, 600, true)]} with data.draudit.params as params
	some f in fs
	f.evidence == {"watch_state": ["prod-eu-1/ResourceClaim"]}
	contains(f.message, "still open")
}

test_a_stopped_collector_is_called_collector_not_running if {
	stopped := object.union(gap(null, 600, true), {"state": "stopped", "reason": "collector stopped: not watching"})
	fs := coverage.findings with input as {"coverage_gaps": [stopped]} with data.draudit.params as params
	some f in fs
	startswith(f.message, "collector not running: ")
	not contains(f.message, "gap")
}

test_a_lost_watch_is_not_called_collector_not_running if {
	fs := coverage.findings with input as {"coverage_gaps": [object.union(gap(17, 61, false), {"state": "gap"})]} with data.draudit.params as params
	some f in fs
	not contains(f.message, "not running")
}

test_a_gap_found_through_a_later_window_keeps_its_own_start_and_duration if {
	# evaluated over a period that starts 500 s into a 600 s gap: the facts clip it, the finding does not
	clipped := object.union(gap(17, 600, false), {"from_ns": 1764410500000000000})
	fs := coverage.findings with input as {"coverage_gaps": [clipped]} with data.draudit.params as params
	some f in fs
	f.from_ns == 1764410000000000000
	f.to_ns == 1764410600000000000
	contains(f.message, "for 600000 ms")
}

test_short_gaps_that_add_up_are_one_finding if {
	# a crash (43 s) and a clean restart (21 s) within one period: each under 60 s, 64 s together
	crash := object.union(gap(31, 43, false), {"state": "stopped"})
	restart := object.union(gap(32, 21, false), {"state": "stopped", "from_ns": 1764410100000000000, "to_ns": 1764410121000000000})
	fs := coverage.findings with input as {"coverage_gaps": [crash, restart]} with data.draudit.params as params
	count(fs) == 1
	some f in fs
	f.rule == "coverage/observation-gaps-add-up"
	f.evidence == {"coverage_intervals": [31, 32]}
	contains(f.message, "for 64000 ms in the period, in 2 intervals")
	f.from_ns == 1764410000000000000
	f.to_ns == 1764410121000000000
}

test_short_gaps_within_the_tolerance_together_are_tolerated if {
	fs := coverage.findings with input as {"coverage_gaps": [gap(31, 30, false), object.union(gap(32, 30, false), {"from_ns": 1764410100000000000, "to_ns": 1764410130000000000})]} with data.draudit.params as params
	count(fs) == 0
}
