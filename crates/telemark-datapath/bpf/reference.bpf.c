// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The yardstick for telemark.bpf.c's cost (`telemark bench-ebpf`, docs/ebpf.md): a program
 * that only counts packets and bytes per flow at each hook, with the same parser (tm_flow.h),
 * the same key and the same map type as the datapath's counting, and nothing else (no colour,
 * no periods, no marking). Attached alone at the hooks Telemark's programs use, in rounds
 * interleaved with theirs, under the same load: the kernel's run_time_ns / run_cnt of both give
 * the price of the measurement itself. (Chained at one hook, the first program would pay for
 * bringing the packet into the cache and the second would look cheap.) Never loaded by the
 * agent.
 *
 * Its counts are per hook, as every per-interface flow meter's are (netobserv keys its flows
 * by interface and direction), and as a counting point's must be: the key's point byte holds
 * the interface's index (its low byte) and the colour byte the direction. Keyed by the flow
 * alone, a packet crossing two hooks would add to one entry twice, and the second hook would
 * find it in the cache, warm from the first: 85-95 ns a run at egress under TCP load here
 * against 110-121 ns keyed per hook, a yardstick no meter of two interfaces can be held to.
 */
#include <linux/pkt_cls.h>

#include "tm_flow.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct ref_counts {
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH); /* as telemark.bpf.c's "counts" */
	__uint(max_entries, 65536);
	__type(key, struct tm_key);
	__type(value, struct ref_counts);
} ref_flows SEC(".maps");

/* Which way a packet passes a hook. */
enum ref_direction {
	REF_INGRESS = 0,
	REF_EGRESS = 1,
};

static __always_inline int count_flow(struct __sk_buff *skb, enum ref_direction dir)
{
	struct tm_key k = {};
	struct tm_ip ip = {};
	if (parse(skb, &ip, &k) != 0)
		return TC_ACT_UNSPEC;
	k.point = (__u8)skb->ifindex;
	k.colour = dir;
	struct ref_counts *v = bpf_map_lookup_elem(&ref_flows, &k);
	if (!v) {
		struct ref_counts fresh = {};
		bpf_map_update_elem(&ref_flows, &k, &fresh, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&ref_flows, &k);
		if (!v)
			return TC_ACT_UNSPEC;
	}
	v->packets += wire_packets(skb);
	v->bytes += skb->len;
	return TC_ACT_UNSPEC;
}

/* One program per direction, as Telemark's, so each has its own run statistics. */
SEC("classifier")
int tm_ref_ingress(struct __sk_buff *skb)
{
	return count_flow(skb, REF_INGRESS);
}

SEC("classifier")
int tm_ref_egress(struct __sk_buff *skb)
{
	return count_flow(skb, REF_EGRESS);
}
