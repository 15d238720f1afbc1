# Observation coverage: the collector reports its own blind spots
# (DORA RTS Art. 23: automated alerts on the completeness of log collection).
#
# Facts (collector/policy/facts.py): input.coverage_gaps[] =
#   {id (coverage_intervals row, null for a gap still open), cluster, kind, started_ns,
#    ended_ns (null when open), open, duration_ns (from the start to its end, or to the last
#    observation when open), from_ns, to_ns (clipped to the period), reason,
#    state: "gap" (the watch stream was lost while the collector ran) or "stopped" (the collector
#    was not running: shut down, or crashed, until it ran again, or still; the evidence pack calls
#    that "collector not running")}
package draudit.coverage

import data.draudit.lib

gap_evidence(g) := {"coverage_intervals": [g.id]} if {
	g.id != null
} else := {"watch_state": [sprintf("%s/%s", [g.cluster, g.kind])]}

# Rule 7: a gap in the watch of one kind longer than the threshold.
findings contains f if {
	some g in input.coverage_gaps
	g.duration_ns > lib.params.coverage_gap_max_s * lib.ns_per_s
	f := {
		"rule": "coverage/observation-gap",
		"severity": "medium",
		"kind": "warning",
		"message": gap_message(g),
		"subjects": {"cluster": g.cluster, "kinds": [g.kind]},
		"evidence": gap_evidence(g),
		"physical_gpu_uuid": null,
		# The gap's own extent, not its part in the evaluated period: the message states its whole
		# duration, and two evaluations over overlapping periods state the same gap (same start,
		# one finding) instead of one clipped piece each.
		"from_ns": g.started_ns,
		"to_ns": g.started_ns + g.duration_ns,
	}
}

# Rule 7b: short gaps that add up. Each interval of one kind within the threshold, but more than
# one, and together more than the threshold in the evaluated period (a collector restarted twice in
# a minute): one finding for them, the clipped durations summed.
findings contains f if {
	some key in {[g.cluster, g.kind] | some g in input.coverage_gaps}
	short := [g |
		some g in input.coverage_gaps
		[g.cluster, g.kind] == key
		g.duration_ns <= lib.params.coverage_gap_max_s * lib.ns_per_s
	]
	count(short) > 1
	total := sum([d | some g in short; d := g.to_ns - g.from_ns])
	total > lib.params.coverage_gap_max_s * lib.ns_per_s
	f := {
		"rule": "coverage/observation-gaps-add-up",
		"severity": "medium",
		"kind": "warning",
		"message": sprintf("the collector did not observe %s objects of cluster %s for %d ms in the period, in %d intervals each within the %v s tolerance (gaps and times it was not running)", [
			key[1], key[0], lib.ms(total), count(short), lib.params.coverage_gap_max_s,
		]),
		"subjects": {"cluster": key[0], "kinds": [key[1]]},
		"evidence": short_evidence(short, key),
		"physical_gpu_uuid": null,
		"from_ns": min([g.from_ns | some g in short]),
		"to_ns": max([g.to_ns | some g in short]),
	}
}

short_evidence(short, key) := evidence if {
	ids := sort([g.id | some g in short; g.id != null])
	open := [g | some g in short; g.id == null]
	evidence := object.union({"coverage_intervals": ids}, open_evidence(open, key))
}

open_evidence(open, _) := {} if count(open) == 0

open_evidence(open, key) := {"watch_state": [sprintf("%s/%s", key)]} if count(open) > 0

open_note(g) := ", still open" if g.open else := ""

# Same words as the evidence pack's coverage section: a stop is "collector not running", not a gap.
gap_message(g) := sprintf("collector not running: the collector stopped and did not observe %s objects of cluster %s for %d ms%s (%v)", [
	g.kind, g.cluster, lib.ms(g.duration_ns), open_note(g), g.reason,
]) if {
	object.get(g, "state", "gap") == "stopped"
} else := sprintf("the collector did not observe %s objects of cluster %s for %d ms%s (%v)", [
	g.kind, g.cluster, lib.ms(g.duration_ns), open_note(g), g.reason,
])
