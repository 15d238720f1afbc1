# Isolation: two tenants never share a physical GPU without hardware partitioning.
#
# Facts (collector/policy/facts.py):
#   input.overlaps[]    two allocations whose intervals overlap on one physical GPU
#                       {physical_gpu_uuid, same_device, from_ns, to_ns, a, b}
#   input.handovers[]   a GPU passing from one claim to the next {released_ns, acquired_ns, gap_ns, from, to}
#   input.allocation_groups[]  every device allocation of the period, grouped (see lib.allocation)
# A side of a pair or handover is {id, claim_uid, namespace, claim, driver, pool, device, mig,
# share_id, allow_multiple_allocations}.
package draudit.isolation

import data.draudit.lib

# ---------------------------------------------------------------------------------------------
# Rule 1: cross-tenant sharing of one physical GPU.
# Pods of one namespace may share one claim (time-slicing, MPS): that is one allocation, never a
# pair here. Two MIG devices of one parent GPU are hardware partitions: shared with isolation.
# ---------------------------------------------------------------------------------------------

cross_tenant(o) if lib.tenant_of(o.a.namespace) != lib.tenant_of(o.b.namespace)

mig_isolated(o) if {
	o.a.mig
	o.b.mig
	not o.same_device
}

sharing_mode(o) := "consumable-capacity shares (shareID) of one device" if {
	o.same_device
	o.a.share_id != null
	o.b.share_id != null
} else := "the same device in two claims" if {
	o.same_device
} else := "MIG partitions of one GPU" if {
	mig_isolated(o)
} else := "different devices of one physical GPU that are not both MIG partitions"

# Strict mode (data.json strict_mig) refuses even MIG-isolated sharing between tenants.
mig_sharing_class := {"severity": "high", "kind": "violation"} if {
	lib.params.strict_mig == true
} else := {"severity": "info", "kind": "observation"}

pair_subjects(o) := {
	"tenants": sort({lib.tenant_of(o.a.namespace), lib.tenant_of(o.b.namespace)}),
	"claims": sort({lib.claim_ref(o.a), lib.claim_ref(o.b)}),
	"devices": sort({lib.device_ref(o.a), lib.device_ref(o.b)}),
}

pair_evidence(o) := {"allocation_results": sort([o.a.id, o.b.id])}

findings contains f if {
	some o in input.overlaps
	cross_tenant(o)
	not mig_isolated(o)
	f := {
		"rule": "isolation/cross-tenant-sharing",
		"severity": "high",
		"kind": "violation",
		"message": sprintf("tenants %s and %s shared physical GPU %s through %s without hardware partitioning (claims %s and %s)", [
			lib.tenant_of(o.a.namespace), lib.tenant_of(o.b.namespace), o.physical_gpu_uuid,
			sharing_mode(o), lib.claim_ref(o.a), lib.claim_ref(o.b),
		]),
		"subjects": pair_subjects(o),
		"evidence": pair_evidence(o),
		"physical_gpu_uuid": o.physical_gpu_uuid,
		"from_ns": o.from_ns,
		"to_ns": o.to_ns,
	}
}

findings contains f if {
	some o in input.overlaps
	cross_tenant(o)
	mig_isolated(o)
	f := {
		"rule": "isolation/shared-with-isolation",
		"severity": mig_sharing_class.severity,
		"kind": mig_sharing_class.kind,
		"message": sprintf("tenants %s and %s used MIG partitions %s and %s of physical GPU %s at the same time (hardware-isolated)", [
			lib.tenant_of(o.a.namespace), lib.tenant_of(o.b.namespace),
			lib.device_ref(o.a), lib.device_ref(o.b), o.physical_gpu_uuid,
		]),
		"subjects": pair_subjects(o),
		"evidence": pair_evidence(o),
		"physical_gpu_uuid": o.physical_gpu_uuid,
		"from_ns": o.from_ns,
		"to_ns": o.to_ns,
	}
}

# ---------------------------------------------------------------------------------------------
# Rule 2: the same device allocated to two claims at once although the device does not allow
# multiple allocations (a scheduler double allocation), whatever the tenants.
# ---------------------------------------------------------------------------------------------

findings contains f if {
	some o in input.overlaps
	o.same_device
	o.a.claim_uid != o.b.claim_uid
	not o.a.allow_multiple_allocations
	f := {
		"rule": "isolation/double-allocation",
		"severity": "high",
		"kind": "violation",
		"message": sprintf("device %s does not allow multiple allocations but was allocated to claims %s and %s at the same time", [
			lib.device_ref(o.a), lib.claim_ref(o.a), lib.claim_ref(o.b),
		]),
		"subjects": {"devices": [lib.device_ref(o.a)], "claims": sort({lib.claim_ref(o.a), lib.claim_ref(o.b)})},
		"evidence": pair_evidence(o),
		"physical_gpu_uuid": o.physical_gpu_uuid,
		"from_ns": o.from_ns,
		"to_ns": o.to_ns,
	}
}

# ---------------------------------------------------------------------------------------------
# Rule 3: a GPU handed from one tenant to another with less than the configured idle gap
# (memory scrubbing and reset need time; a fast handover is worth a look).
# ---------------------------------------------------------------------------------------------

findings contains f if {
	some h in input.handovers
	lib.tenant_of(h.from.namespace) != lib.tenant_of(h.to.namespace)
	h.gap_ns < lib.params.handover_min_gap_s * lib.ns_per_s
	f := {
		"rule": "isolation/tenant-handover-gap",
		"severity": "medium",
		"kind": "warning",
		"message": sprintf("physical GPU %s passed from tenant %s (claim %s) to tenant %s (claim %s) after %d ms, less than the %d s minimum gap", [
			h.physical_gpu_uuid, lib.tenant_of(h.from.namespace), lib.claim_ref(h.from),
			lib.tenant_of(h.to.namespace), lib.claim_ref(h.to), lib.ms(h.gap_ns), lib.params.handover_min_gap_s,
		]),
		"subjects": {
			"tenants": [lib.tenant_of(h.from.namespace), lib.tenant_of(h.to.namespace)],
			"claims": [lib.claim_ref(h.from), lib.claim_ref(h.to)],
			"devices": sort({lib.device_ref(h.from), lib.device_ref(h.to)}),
		},
		"evidence": {"allocation_results": [h.from.id, h.to.id]},
		"physical_gpu_uuid": h.physical_gpu_uuid,
		"from_ns": h.released_ns,
		"to_ns": h.acquired_ns,
	}
}

# ---------------------------------------------------------------------------------------------
# Rule 4: adminAccess (monitoring access to a device that may belong to another claim) requested
# from a namespace that is not allowed to.
# ---------------------------------------------------------------------------------------------

admin_namespaces := {ns | some ns in lib.params.admin_access_namespaces}

findings contains f if {
	some g in input.allocation_groups
	g.admin_access
	not g.namespace in admin_namespaces
	some m in g.allocations
	a := lib.allocation(g, m)
	f := {
		"rule": "isolation/admin-access",
		"severity": "high",
		"kind": "violation",
		"message": sprintf("claim %s got adminAccess to device %s but namespace %s is not allowed adminAccess", [
			lib.claim_ref(a), lib.device_ref(a), a.namespace,
		]),
		"subjects": {"claims": [lib.claim_ref(a)], "devices": [lib.device_ref(a)], "namespaces": [a.namespace]},
		"evidence": {"allocation_results": [a.id]},
		"physical_gpu_uuid": a.physical_gpu_uuid,
		"from_ns": a.from_ns,
		"to_ns": a.to_ns,
	}
}
