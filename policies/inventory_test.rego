# Inventory rules, told as short stories. Parameters are pinned here.
package draudit.inventory_test

import data.draudit.inventory

params := {
	"tenants": {},
	"approved_device_classes": ["gpu.nvidia.com", "mig.nvidia.com"],
	"admin_access_namespaces": ["gpu-monitoring"],
	"handover_min_gap_s": 300,
	"exact_attribution_min_ratio": 0.99,
	"coverage_gap_max_s": 60,
	"idle_allocation_max_s": 3600,
	"strict_mig": false,
}

alloc(extra) := object.union(
	{
		"id": 11, "episode_id": 5, "claim_uid": "uid-fraud-0-gpu", "namespace": "risk-inference", "claim": "fraud-0-gpu",
		"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0", "device_class": "gpu.nvidia.com",
		"mig": false, "share_id": null, "admin_access": false, "allow_multiple_allocations": false,
		"physical_gpu_uuid": "GPU-8c1f2e3a-6b7d-4e21-9f00-3a5b7c9d1e01", "device_state_id": 7,
		"from_ns": 1000, "to_ns": 9000,
	},
	extra,
)

facts(allocations, idle) := {"allocation_groups": groups(allocations), "idle_allocations": idle}

rules(fs) := {f.rule | some f in fs}

# allocation facts as the collector groups them (one group per allocation here)
groups(allocations) := [{
	"namespace": a.namespace, "device_class": a.device_class, "admin_access": a.admin_access,
	"known_device": a.device_state_id != null,
	"allocations": [[a.id, a.claim, a.driver, a.pool, a.device, a.physical_gpu_uuid, a.from_ns, a.to_ns]],
} | some a in allocations]

test_an_allocation_from_an_approved_device_class_of_a_known_device_is_fine if {
	fs := inventory.findings with input as facts([alloc({})], []) with data.draudit.params as params
	count(fs) == 0
}

test_an_allocation_from_an_unapproved_device_class_is_a_high_violation if {
	fs := inventory.findings with input as facts([alloc({"device_class": "vfio.gpu.nvidia.com"})], [])
		with data.draudit.params as params
	rules(fs) == {"inventory/unapproved-device-class"}
	some f in fs
	f.severity == "high"
	f.kind == "violation"
	f.subjects.device_classes == ["vfio.gpu.nvidia.com"]
	f.evidence.allocation_results == [11]
}

test_an_allocation_with_no_device_class_recorded_is_not_approved if {
	fs := inventory.findings with input as facts([alloc({"device_class": null})], []) with data.draudit.params as params
	rules(fs) == {"inventory/unapproved-device-class"}
}

test_a_device_no_resourceslice_published_is_unknown_inventory if {
	fs := inventory.findings with input as facts([alloc({"device_state_id": null, "physical_gpu_uuid": null})], [])
		with data.draudit.params as params
	rules(fs) == {"inventory/unknown-device"}
	some f in fs
	f.severity == "high"
	f.subjects.devices == ["gpu.nvidia.com/node-a/gpu-0"]
}

idle(duration_s) := {
	"episode_id": 5, "claim_uid": "uid-fraud-0-gpu", "namespace": "risk-inference", "claim": "fraud-0-gpu",
	"idle_from_ns": 0, "idle_to_ns": duration_s * 1000000000, "duration_ns": duration_s * 1000000000,
	"from_ns": 0, "to_ns": duration_s * 1000000000,
}

test_an_allocation_held_without_consumer_longer_than_allowed_is_a_low_warning if {
	fs := inventory.findings with input as facts([], [idle(3601)]) with data.draudit.params as params
	rules(fs) == {"inventory/idle-allocation"}
	some f in fs
	f.severity == "low"
	f.kind == "warning"
	f.evidence.allocation_episodes == [5]
}

test_an_allocation_idle_for_exactly_the_allowed_time_is_fine if {
	fs := inventory.findings with input as facts([], [idle(3600)]) with data.draudit.params as params
	count(fs) == 0
}

test_an_idle_stretch_seen_through_a_later_window_keeps_the_interval_its_message_measures if {
	# the facts clip the stretch to a period starting 1000 s into it; the message speaks of all 5000 s
	late := object.union(idle(5000), {"from_ns": 1000000000000})
	fs := inventory.findings with input as facts([], [late]) with data.draudit.params as params
	some f in fs
	[f.from_ns, f.to_ns] == [0, 5000000000000]
	contains(f.message, "for 5000000 ms")
}
