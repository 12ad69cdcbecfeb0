// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * A lossy link for tests: a tc program that drops one IPv4 packet in 40 at random (verdict
 * TC_ACT_SHOT, which the kernel reports as a TC drop and counts in the clsact qdisc's
 * "dropped"). This kernel has neither act_gact nor cls_u32, so a BPF classifier is the tc drop.
 *
 *   clang -O2 -target bpfel -I/usr/include/$(uname -m)-linux-gnu -c tc-drop.bpf.c -o drop.o
 *   tc qdisc add dev IF clsact
 *   tc filter add dev IF egress bpf da obj drop.o sec tc
 *   tc -s qdisc show dev IF          # clsact's "dropped": what it dropped
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>

#define SEC(name) __attribute__((section(name), used))

static __u32 (*bpf_get_prandom_u32)(void) = (void *)BPF_FUNC_get_prandom_u32;

SEC("tc")
int drop_one_in_40(struct __sk_buff *skb)
{
	if (skb->protocol == __builtin_bswap16(0x0800) && bpf_get_prandom_u32() % 40 == 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
