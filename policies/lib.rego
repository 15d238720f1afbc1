# Shared vocabulary of the draudit bundle: parameters, tenants and how subjects are named.
#
# Parameters live in data.json under data.draudit.params:
#   tenants                      namespace -> tenant; a namespace that is not listed is its own tenant
#   approved_device_classes      DeviceClass names allocations may come from
#   admin_access_namespaces      namespaces allowed to request adminAccess (monitoring)
#   handover_min_gap_s           minimum idle time of a GPU between two tenants, seconds
#   exact_attribution_min_ratio  share of transactions that must be attributed exactly (0..1)
#   coverage_gap_max_s           longest acceptable observation gap of the watcher, seconds
#   idle_allocation_max_s        longest acceptable allocation without a consumer, seconds
#   strict_mig                   true: MIG-isolated sharing between tenants is a violation too
package draudit.lib

params := data.draudit.params

ns_per_s := 1000000000

# The tenant a namespace belongs to.
tenant_of(namespace) := object.get(object.get(params, "tenants", {}), namespace, namespace)

# "namespace/name" of the ResourceClaim behind an allocation fact.
claim_ref(a) := sprintf("%s/%s", [a.namespace, a.claim])

# "driver/pool/device": how the DRA API names a device cluster-wide.
device_ref(a) := sprintf("%s/%s/%s", [a.driver, a.pool, a.device])

# Whole milliseconds of a duration in nanoseconds (for messages).
ms(duration_ns) := floor(duration_ns / 1000000)

# One member of input.allocation_groups[_].allocations as an object. Facts group allocations by
# what the per-allocation rules decide on (namespace, DeviceClass, adminAccess, known device);
# each member is [id, claim, driver, pool, device, physical_gpu_uuid, from_ns, to_ns].
allocation(g, m) := {
	"id": m[0], "claim": m[1], "driver": m[2], "pool": m[3], "device": m[4],
	"physical_gpu_uuid": m[5], "from_ns": m[6], "to_ns": m[7],
	"namespace": g.namespace, "device_class": g.device_class,
	"admin_access": g.admin_access, "known_device": g.known_device,
}
