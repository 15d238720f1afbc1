# Isolation rules, told as short stories. Parameters are pinned here so that editing data.json
# does not change what the tests mean.
package draudit.isolation_test

import data.draudit.isolation

params := {
	"tenants": {"risk-inference": "bank-risk", "risk-batch": "bank-risk", "marketing": "bank-marketing"},
	"approved_device_classes": ["gpu.nvidia.com", "mig.nvidia.com"],
	"admin_access_namespaces": ["gpu-monitoring"],
	"handover_min_gap_s": 300,
	"exact_attribution_min_ratio": 0.99,
	"coverage_gap_max_s": 60,
	"idle_allocation_max_s": 3600,
	"strict_mig": false,
}

gpu := "GPU-8c1f2e3a-6b7d-4e21-9f00-3a5b7c9d1e01"

alloc(id, namespace, claim, device, extra) := object.union(
	{
		"id": id, "episode_id": id, "claim_uid": sprintf("uid-%s", [claim]), "namespace": namespace, "claim": claim,
		"driver": "gpu.nvidia.com", "pool": "node-a", "device": device, "device_class": "gpu.nvidia.com",
		"mig": false, "share_id": null, "admin_access": false, "allow_multiple_allocations": false,
		"physical_gpu_uuid": gpu, "device_state_id": 7, "from_ns": 1000, "to_ns": 9000,
	},
	extra,
)

overlap(a, b) := {"physical_gpu_uuid": gpu, "same_device": a.device == b.device, "from_ns": 2000, "to_ns": 8000, "a": a, "b": b}

facts(overlaps) := {"overlaps": overlaps, "handovers": [], "allocation_groups": []}

rules(fs) := {f.rule | some f in fs}

# allocation facts as the collector groups them (one group per allocation here)
groups(allocations) := [{
	"namespace": a.namespace, "device_class": a.device_class, "admin_access": a.admin_access,
	"known_device": a.device_state_id != null,
	"allocations": [[a.id, a.claim, a.driver, a.pool, a.device, a.physical_gpu_uuid, a.from_ns, a.to_ns]],
} | some a in allocations]

test_two_tenants_holding_shares_of_one_device_is_a_high_violation if {
	a := alloc(1, "risk-inference", "fraud-0-gpu", "gpu-0", {"share_id": "3f1c", "allow_multiple_allocations": true})
	b := alloc(2, "marketing", "recs-0-gpu", "gpu-0", {"share_id": "9a2e", "allow_multiple_allocations": true})
	fs := isolation.findings with input as facts([overlap(a, b)]) with data.draudit.params as params
	rules(fs) == {"isolation/cross-tenant-sharing"}
	some f in fs
	f.severity == "high"
	f.kind == "violation"
	f.subjects.tenants == ["bank-marketing", "bank-risk"]
	f.physical_gpu_uuid == gpu
	contains(f.message, "shareID")
}

test_two_tenants_in_two_claims_of_one_exclusive_device_is_sharing_and_a_double_allocation if {
	a := alloc(1, "risk-inference", "fraud-0-gpu", "gpu-0", {})
	b := alloc(2, "marketing", "recs-0-gpu", "gpu-0", {})
	fs := isolation.findings with input as facts([overlap(a, b)]) with data.draudit.params as params
	rules(fs) == {"isolation/cross-tenant-sharing", "isolation/double-allocation"}
}

test_mig_partitions_of_one_gpu_used_by_two_tenants_are_an_info_observation if {
	a := alloc(1, "risk-inference", "fraud-0-mig", "gpu-0-mig-1g10gb-19-0", {"mig": true, "device_class": "mig.nvidia.com"})
	b := alloc(2, "marketing", "recs-0-mig", "gpu-0-mig-1g10gb-19-1", {"mig": true, "device_class": "mig.nvidia.com"})
	fs := isolation.findings with input as facts([overlap(a, b)]) with data.draudit.params as params
	rules(fs) == {"isolation/shared-with-isolation"}
	some f in fs
	f.severity == "info"
	f.kind == "observation"
}

test_strict_mig_mode_makes_mig_sharing_between_tenants_a_violation if {
	a := alloc(1, "risk-inference", "fraud-0-mig", "gpu-0-mig-1g10gb-19-0", {"mig": true})
	b := alloc(2, "marketing", "recs-0-mig", "gpu-0-mig-1g10gb-19-1", {"mig": true})
	strict := object.union(params, {"strict_mig": true})
	fs := isolation.findings with input as facts([overlap(a, b)]) with data.draudit.params as strict
	some f in fs
	f.rule == "isolation/shared-with-isolation"
	f.severity == "high"
	f.kind == "violation"
}

test_one_mig_partition_in_claims_of_two_tenants_is_not_isolated if {
	a := alloc(1, "risk-inference", "fraud-0-mig", "gpu-0-mig-1g10gb-19-0", {"mig": true})
	b := alloc(2, "marketing", "recs-0-mig", "gpu-0-mig-1g10gb-19-0", {"mig": true})
	fs := isolation.findings with input as facts([overlap(a, b)]) with data.draudit.params as params
	"isolation/cross-tenant-sharing" in rules(fs)
	not "isolation/shared-with-isolation" in rules(fs)
}

test_a_full_gpu_and_a_mig_partition_of_it_for_two_tenants_is_a_violation if {
	a := alloc(1, "risk-inference", "fraud-0-gpu", "gpu-0", {})
	b := alloc(2, "marketing", "recs-0-mig", "gpu-0-mig-1g10gb-19-0", {"mig": true})
	fs := isolation.findings with input as facts([overlap(a, b)]) with data.draudit.params as params
	rules(fs) == {"isolation/cross-tenant-sharing"}
}

test_two_namespaces_of_one_tenant_sharing_a_gpu_is_not_cross_tenant if {
	a := alloc(1, "risk-inference", "fraud-0-gpu", "gpu-0", {"share_id": "3f1c", "allow_multiple_allocations": true})
	b := alloc(2, "risk-batch", "scoring-0-gpu", "gpu-0", {"share_id": "9a2e", "allow_multiple_allocations": true})
	fs := isolation.findings with input as facts([overlap(a, b)]) with data.draudit.params as params
	count(fs) == 0
}

test_a_namespace_not_listed_in_tenants_is_its_own_tenant if {
	a := alloc(1, "risk-inference", "fraud-0-gpu", "gpu-0", {"share_id": "3f1c", "allow_multiple_allocations": true})
	b := alloc(2, "sandbox", "notebook-gpu", "gpu-0", {"share_id": "9a2e", "allow_multiple_allocations": true})
	fs := isolation.findings with input as facts([overlap(a, b)]) with data.draudit.params as params
	some f in fs
	f.subjects.tenants == ["bank-risk", "sandbox"]
}

test_double_allocation_of_an_exclusive_device_within_one_tenant_is_a_high_violation if {
	a := alloc(1, "risk-inference", "fraud-0-gpu", "gpu-0", {})
	b := alloc(2, "risk-inference", "fraud-1-gpu", "gpu-0", {})
	fs := isolation.findings with input as facts([overlap(a, b)]) with data.draudit.params as params
	rules(fs) == {"isolation/double-allocation"}
	some f in fs
	f.severity == "high"
	f.subjects.devices == ["gpu.nvidia.com/node-a/gpu-0"]
}

test_a_device_that_allows_multiple_allocations_is_not_double_allocated if {
	a := alloc(1, "risk-inference", "fraud-0-gpu", "gpu-0", {"share_id": "3f1c", "allow_multiple_allocations": true})
	b := alloc(2, "risk-inference", "fraud-1-gpu", "gpu-0", {"share_id": "9a2e", "allow_multiple_allocations": true})
	fs := isolation.findings with input as facts([overlap(a, b)]) with data.draudit.params as params
	count(fs) == 0
}

handover(gap_s, from_ns, to_ns) := {
	"physical_gpu_uuid": gpu, "released_ns": 5000000000, "acquired_ns": 5000000000 + gap_s * 1000000000,
	"gap_ns": gap_s * 1000000000,
	"from": alloc(1, from_ns, "job-a", "gpu-0", {}), "to": alloc(2, to_ns, "job-b", "gpu-0", {}),
}

test_a_gpu_handed_to_another_tenant_faster_than_the_gap_is_a_medium_warning if {
	fs := isolation.findings with input as {"overlaps": [], "allocation_groups": [], "handovers": [handover(12, "risk-inference", "marketing")]}
		with data.draudit.params as params
	rules(fs) == {"isolation/tenant-handover-gap"}
	some f in fs
	f.severity == "medium"
	f.kind == "warning"
	f.subjects.tenants == ["bank-risk", "bank-marketing"]
	contains(f.message, "after 12000 ms")
}

test_a_gpu_handed_to_another_tenant_after_the_gap_is_fine if {
	fs := isolation.findings with input as {"overlaps": [], "allocation_groups": [], "handovers": [handover(300, "risk-inference", "marketing")]}
		with data.draudit.params as params
	count(fs) == 0
}

test_a_fast_handover_within_one_tenant_is_fine if {
	fs := isolation.findings with input as {"overlaps": [], "allocation_groups": [], "handovers": [handover(0, "risk-inference", "risk-batch")]}
		with data.draudit.params as params
	count(fs) == 0
}

test_admin_access_outside_the_allowed_namespaces_is_a_high_violation if {
	a := alloc(3, "risk-inference", "debug-gpu", "gpu-0", {"admin_access": true})
	fs := isolation.findings with input as {"overlaps": [], "handovers": [], "allocation_groups": groups([a])} with data.draudit.params as params
	rules(fs) == {"isolation/admin-access"}
	some f in fs
	f.severity == "high"
	f.subjects.namespaces == ["risk-inference"]
}

test_admin_access_from_the_monitoring_namespace_is_allowed if {
	a := alloc(3, "gpu-monitoring", "dcgm-gpu", "gpu-0", {"admin_access": true})
	fs := isolation.findings with input as {"overlaps": [], "handovers": [], "allocation_groups": groups([a])} with data.draudit.params as params
	count(fs) == 0
}
