// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The yardstick for telemark.bpf.c's cost (`telemark bench-ebpf`, docs/ebpf.md): a program
 * that only counts packets and bytes per flow, with the same parser (tm_flow.h), the same key
 * and the same map type as the datapath's counting, and nothing else (no colour, no periods,
 * no marking). Attached alone at the hooks Telemark's programs use, in rounds interleaved
 * with theirs, under the same load: the kernel's run_time_ns / run_cnt of both give the price
 * of the measurement itself. (Chained at one hook, the first program would pay for bringing
 * the packet into the cache and the second would look cheap.) Never loaded by the agent.
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

static __always_inline int count_flow(struct __sk_buff *skb)
{
	struct tm_key k = {};
	struct tm_ip ip = {};
	if (parse(skb, &ip, &k) != 0)
		return TC_ACT_UNSPEC;
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
	return count_flow(skb);
}

SEC("classifier")
int tm_ref_egress(struct __sk_buff *skb)
{
	return count_flow(skb);
}
