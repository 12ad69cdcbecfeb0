/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A packet's flow key, as every Telemark program reads it: telemark.bpf.c (the datapath) and
 * reference.bpf.c (the counting-only program `telemark bench-ebpf` compares it with), so the
 * two parse the same bytes the same way.
 */
#ifndef TM_FLOW_H
#define TM_FLOW_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>

#include "telemark_bpf.h"

/* A flow at a point in one colour. IPv4 addresses are IPv4-mapped IPv6 (::ffff:a.b.c.d). */
struct tm_key {
	__u8 src[16];
	__u8 dst[16];
	__u16 sport; /* host order */
	__u16 dport;
	__u8 proto;
	__u8 point;
	__u8 colour;
	__u8 pad;
};

/* Where the IP header is and what it says. */
struct tm_ip {
	void *l3;
	__u32 l3_offset; /* from the start of the frame, for the helpers that write */
	__u8 version;    /* 4 or 6 */
};

static __always_inline void v4_mapped(__u8 *out, __u32 addr)
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(out + 12, &addr, 4);
}

/* What parsing a frame found. */
enum tm_parsed {
	TM_PARSED = 0,    /* a flow key */
	TM_NOT_IP = -1,   /* not IPv4/IPv6 over Ethernet, or a malformed header */
	TM_SHORT = -2,    /* the headers end beyond the bytes at hand */
};

/* The flow key of an IPv4 packet whose header is in [ip, end). Ports of non-first fragments
 * and of protocols without ports are 0. */
static __always_inline int key_v4(struct iphdr *ip, void *end, struct tm_key *k)
{
	if ((void *)(ip + 1) > end)
		return TM_SHORT;
	if (ip->ihl < 5)
		return TM_NOT_IP;
	v4_mapped(k->src, ip->saddr);
	v4_mapped(k->dst, ip->daddr);
	k->proto = ip->protocol;
	if (ip->frag_off & bpf_htons(0x1fff))
		return TM_PARSED;
	if (ip->protocol == IPPROTO_TCP || ip->protocol == IPPROTO_UDP ||
	    ip->protocol == IPPROTO_SCTP || ip->protocol == IPPROTO_UDPLITE) {
		__u16 *l4 = (void *)ip + ip->ihl * 4;
		if ((void *)(l4 + 2) > end)
			return TM_SHORT;
		k->sport = bpf_ntohs(l4[0]);
		k->dport = bpf_ntohs(l4[1]);
	}
	return TM_PARSED;
}

static __always_inline int key_v6(struct ipv6hdr *ip, void *end, struct tm_key *k)
{
	if ((void *)(ip + 1) > end)
		return TM_SHORT;
	__builtin_memcpy(k->src, &ip->saddr, 16);
	__builtin_memcpy(k->dst, &ip->daddr, 16);
	k->proto = ip->nexthdr;
	if (ip->nexthdr == IPPROTO_TCP || ip->nexthdr == IPPROTO_UDP ||
	    ip->nexthdr == IPPROTO_SCTP || ip->nexthdr == IPPROTO_UDPLITE) {
		__u16 *l4 = (void *)(ip + 1);
		if ((void *)(l4 + 2) > end)
			return TM_SHORT;
		k->sport = bpf_ntohs(l4[0]);
		k->dport = bpf_ntohs(l4[1]);
	}
	return TM_PARSED;
}

/* Parses the Ethernet frame (one VLAN tag allowed) in the skb's linear data. */
static __always_inline int parse_linear(struct __sk_buff *skb, struct tm_ip *ip,
					struct tm_key *k)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return TM_SHORT;
	__u16 proto = eth->h_proto;
	void *l3 = eth + 1;
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		__u16 *tag = l3;
		if ((void *)(tag + 2) > end)
			return TM_SHORT;
		proto = tag[1];
		l3 = tag + 2;
	}
	ip->l3 = l3;
	ip->l3_offset = (__u32)(l3 - data);
	if (proto == bpf_htons(ETH_P_IP)) {
		ip->version = 4;
		return key_v4(l3, end, k);
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		ip->version = 6;
		return key_v6(l3, end, k);
	}
	return TM_NOT_IP;
}

/* The most header bytes a flow key needs: Ethernet, a VLAN tag, IPv4 with options, the ports. */
#define TM_HEADERS (14 + 4 + 60 + 4)

/* Parses a frame: TM_PARSED or TM_NOT_IP. Headers are read in place, in the skb's linear data,
 * where a NIC driver or the local stack puts them; a sender that leaves them in pages
 * (AF_PACKET's TX ring, for one) has them pulled into the linear data first (as the
 * kernel's pskb_may_pull does for the stack), which only such skbs pay for. */
static __always_inline int parse(struct __sk_buff *skb, struct tm_ip *ip, struct tm_key *k)
{
	int r = parse_linear(skb, ip, k);
	if (r != TM_SHORT)
		return r;
	__u32 linear = (__u32)(skb->data_end - skb->data);
	if (skb->len <= linear)
		return TM_NOT_IP; /* truncated: no flow to count */
	if (bpf_skb_pull_data(skb, skb->len < TM_HEADERS ? skb->len : TM_HEADERS) != 0)
		return TM_NOT_IP;
	r = parse_linear(skb, ip, k);
	return r == TM_PARSED ? TM_PARSED : TM_NOT_IP;
}

/* Packets on the wire an skb stands for: a GSO or GRO skb is many (whether a host segments
 * or aggregates differs, so counting skbs would disagree between hosts). */
static __always_inline __u32 wire_packets(struct __sk_buff *skb)
{
	__u32 segs = skb->gso_segs;
	return segs ? segs : 1;
}

#endif
