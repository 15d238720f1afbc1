# Inventory: every allocated device is known and approved, and held devices are in use
# (DORA Art. 8: identify and keep an inventory of ICT assets).
#
# Facts (collector/policy/facts.py):
#   input.allocation_groups[] every device allocation of the period, grouped by namespace,
#                             DeviceClass, adminAccess and known_device (false when no ResourceSlice
#                             ever published the device); members read with lib.allocation
#   input.idle_allocations[]  stretches of an allocation with no consumer in reservedFor
#                             {episode_id, claim, namespace, claim_uid, idle_from_ns, idle_to_ns,
#                              duration_ns, from_ns, to_ns}
package draudit.inventory

import data.draudit.lib

approved_classes := {c | some c in lib.params.approved_device_classes}

# Rule 5a: allocation from a DeviceClass that is not approved.
findings contains f if {
	some g in input.allocation_groups
	not g.device_class in approved_classes
	some m in g.allocations
	a := lib.allocation(g, m)
	f := {
		"rule": "inventory/unapproved-device-class",
		"severity": "high",
		"kind": "violation",
		"message": sprintf("claim %s was allocated device %s from DeviceClass %v, which is not approved", [
			lib.claim_ref(a), lib.device_ref(a), a.device_class,
		]),
		"subjects": {"claims": [lib.claim_ref(a)], "devices": [lib.device_ref(a)], "device_classes": [a.device_class]},
		"evidence": {"allocation_results": [a.id]},
		"physical_gpu_uuid": a.physical_gpu_uuid,
		"from_ns": a.from_ns,
		"to_ns": a.to_ns,
	}
}

# Rule 5b: allocation of a device that no ResourceSlice record describes (unknown inventory).
findings contains f if {
	some g in input.allocation_groups
	g.known_device == false
	some m in g.allocations
	a := lib.allocation(g, m)
	f := {
		"rule": "inventory/unknown-device",
		"severity": "high",
		"kind": "violation",
		"message": sprintf("claim %s was allocated device %s, which no observed ResourceSlice publishes", [
			lib.claim_ref(a), lib.device_ref(a),
		]),
		"subjects": {"claims": [lib.claim_ref(a)], "devices": [lib.device_ref(a)]},
		"evidence": {"allocation_results": [a.id]},
		"physical_gpu_uuid": null,
		"from_ns": a.from_ns,
		"to_ns": a.to_ns,
	}
}

# Rule 8: an allocation held with no consumer for longer than the threshold.
findings contains f if {
	some i in input.idle_allocations
	i.duration_ns > lib.params.idle_allocation_max_s * lib.ns_per_s
	f := {
		"rule": "inventory/idle-allocation",
		"severity": "low",
		"kind": "warning",
		"message": sprintf("claim %s held its devices for %d ms with no consumer, more than the %d s allowed", [
			lib.claim_ref(i), lib.ms(i.duration_ns), lib.params.idle_allocation_max_s,
		]),
		"subjects": {"claims": [lib.claim_ref(i)]},
		"evidence": {"allocation_episodes": [i.episode_id]},
		"physical_gpu_uuid": null,
		# the idle stretch the message measures (not its part in the evaluated period), so that
		# the interval shown with the message is the one it speaks of
		"from_ns": i.idle_from_ns,
		"to_ns": i.idle_from_ns + i.duration_ns,
	}
}
