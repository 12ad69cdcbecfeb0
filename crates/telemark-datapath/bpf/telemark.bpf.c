// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Telemark's eBPF datapath (docs/ebpf.md): the loss paper's measurement at the tc hooks of
 * interfaces a host already has, and the kernel's own drop reasons.
 *
 * - tm_ingress / tm_egress (tcx or clsact): alternate marking per RFC 9341 §3.2 (time-based:
 *   the colour of period k = floor(t / T) is k mod 2, carried in one DSCP bit), and at every
 *   attached port per-flow, per-colour packet and byte counts of each period at an ingress and
 *   an egress point. A packet of the other colour than the current period's belongs to the
 *   period before: counted in time within the guard, as late after it. User space reads a
 *   period once its guard has passed (telemark_datapath::ebpf).
 * - tm_drop (tp_btf/kfree_skb): drops per flow and drop reason, and per reason for all.
 * - With sFlow on, tm_ingress also samples one packet in N at each ingress point (sFlow v5's
 *   random 1-in-N sampling) and sends its headers to user space through a perf buffer.
 *
 * Times are Unix time (CLOCK_TAI less the kernel's TAI offset), so that hosts synchronised by
 * NTP or PTP agree on the periods, with each other and with the AF_PACKET switch.
 * Every layout below is mirrored in crates/telemark-datapath/src/ebpf/maps.rs.
 *
 * Rebuild: make -C crates/telemark-datapath/bpf (CI checks the committed object is what this
 * source builds to).
 */
#include <linux/pkt_cls.h>

#include "tm_flow.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* A point id meaning "no point here". */
#define TM_NO_POINT 0xff

/* What a port does to the traffic arriving on it. */
enum tm_ingress_action {
	TM_IN_COUNT = 0, /* count it at the port's ingress point */
	TM_IN_MARK = 1,  /* the measured domain starts here: colour it, count it (the marker) */
};

/* What a port does to the traffic leaving by it. */
enum tm_egress_action {
	TM_OUT_COUNT = 0,  /* count it at the port's egress point */
	TM_OUT_UNMARK = 1, /* the domain ends here: count it, then give the DSCP bit back */
};

/* What the hooks of an attached interface do. */
struct tm_port {
	__u8 in_point;
	__u8 out_point;
	__u8 in_action;  /* enum tm_ingress_action */
	__u8 out_action; /* enum tm_egress_action */
};

/* Map "ports": an attached interface's port in slot ifindex mod TM_PORT_SLOTS, with the index
 * it belongs to. An array, not a hash: the verifier inlines an array lookup, which saves about
 * 40 ns a packet here; user space refuses an interface whose slot another one holds.
 *
 * A slot also holds a copy of every setting a hook reads for each packet (user space writes
 * them into every slot; the programs keep period_seen and the tick clock's offset), so that
 * a packet's run touches one line of it. Under TCP load each line a run touches is cold (the
 * kernel copying 64 KB skbs evicts it between runs): the port and the settings in their own
 * maps took three lines, and about 35 ns a packet more than a run touching none. The 56
 * bytes read per packet come after 8 read only while sampling: array values start 8 bytes
 * before a cache line on Linux 6.18 (struct bpf_array is 312 bytes), where they are then one
 * line; where values start on a line, the whole slot is. On other kernels, maybe two lines. */
#define TM_PORT_SLOTS 65536
struct tm_port_slot {
	__u32 sample_bytes; /* sFlow: the most bytes of a sampled packet sent (its headers) */
	__u32 pad;
	/* Read by every packet: */
	__u32 ifindex; /* 0: free */
	struct tm_port port;
	__u64 period_ns;
	__u64 guard_ns;
	__u64 tick_offset_ns; /* the tick clock's: the programs' own, see tick_now() */
	__u64 period_seen;    /* the period a packet here was last seen in: see period_at() */
	__u32 sample_rate;    /* sFlow: sample one packet in this many arriving (0: none) */
	__u32 tick_ns;        /* the kernel's tick (a jiffy), for the tick clock */
	__u16 tick_seen;      /* the tick tick_offset_ns was set in (its low 16 bits) */
	__u16 tai_offset_s;   /* CLOCK_TAI minus CLOCK_REALTIME, in seconds: see unix_now() */
	__u8 colour_bit;      /* DSCP bit 0..5 */
	__u8 clock;           /* enum tm_clock: the counting points' */
	__u8 restore;         /* enum tm_restore: this marker's own (kept by user space) */
	__u8 own_colour;      /* enum tm_own_colour */
};

/* Whether some flow's own DSCP has the colour bit (map "settings"): an exit looks flows up in
 * "original" (TM_OWN_OVERWRITE) or "unsure" (TM_OWN_KEEP) only once one has. */
enum tm_restore {
	TM_RESTORE_NONE = 0,
	TM_RESTORE_SOME = 1,
};

/* What the domain does with a packet whose sender set the colour bit ([ebpf] own_colour). */
enum tm_own_colour {
	/* Leave it as it is (the default): a marker neither colours nor counts it (it counts it in
	 * "own"), and holds a new flow's first packet back from colour 1, so that an exit, on any
	 * host, sees a marked flow without the bit first; an exit clears the bit only of flows it
	 * has seen without it ("unsure" holds those it has not). */
	TM_OWN_KEEP = 0,
	/* The domain reserves the bit: a marker colours every packet, remembering a flow's own bit
	 * ("original"), which an exit on the same host gives back and any other clears. */
	TM_OWN_OVERWRITE = 1,
};

/* The clock a counting point reads (the marker always reads the fine one). */
enum tm_clock {
	TM_CLOCK_FINE = 0, /* bpf_ktime_get_tai_ns: exact, but it reads the TSC, serialised */
	TM_CLOCK_TICK = 1, /* the kernel's jiffies: Unix time to within a tick (see tick_now());
			    * chosen by user space when a tick is a small part of the guard */
};

/* The settings (map "settings"). A copy of those a hook reads for every packet is in each port's
 * slot: the hooks read these only where a marker remembers a flow's own colour bit and where
 * an exit gives it back, and the drop program for all it does. */
struct tm_settings {
	__u64 period_ns;
	__u64 guard_ns;
	__u8 colour_bit; /* DSCP bit 0..5 */
	__u8 restore;    /* enum tm_restore */
	__u8 pad[2];
	/* This kernel's SKB_CONSUMED (a free after use, not a drop; from its BTF), or ~0. */
	__u32 consumed_reason;
	/* CLOCK_TAI minus CLOCK_REALTIME (the kernel's leap seconds, maybe 0): taken off, so that
	 * periods are on Unix time, as the AF_PACKET switch's packet timestamps are, and hosts
	 * agree whether or not something set their TAI offset. */
	__u64 tai_offset_ns;
	/* The period some packet was last seen in (the drop program's: see period_at()). */
	__u64 period_seen;
};

/* One period's counts at one point, on one CPU. What every packet writes comes first, in 32
 * bytes: the map's 96-byte values lie one after another in page-aligned per-CPU chunks, so
 * they start on 32-byte boundaries and those 32 bytes share one cache line (with last_ns
 * after first_ns, half the values had it in the next line). */
struct tm_batch {
	__u64 period; /* k: the batch covers [kT, (k+1)T) at the marker */
	__u64 packets;
	__u64 bytes;
	__u64 last_ns;  /* last in-time packet */
	__u64 first_ns; /* written when the period starts */
	__u64 late;     /* packets after the guard */
};

/* The period being counted and the one of the same colour before it (two periods back): user
 * space has until the period after next of a colour starts to read one. */
struct tm_slots {
	struct tm_batch cur;
	struct tm_batch prev;
};

/* A drop the kernel reported, per flow (point and colour 0) and reason. */
struct tm_drop_key {
	struct tm_key flow;
	__u32 reason;
};

/* Counters (map "stats", per CPU). */
enum tm_stat {
	TM_STAT_NOT_IP = 0,      /* not IPv4/IPv6 over Ethernet: passed, not counted */
	TM_STAT_MARKED,          /* coloured by a marker */
	TM_STAT_UNMARKED,        /* colour bit given back at a domain exit */
	TM_STAT_REFUSED,         /* no room in "counts": a flow not measured there */
	TM_STAT_LATE,            /* counted late (after the guard) */
	TM_STAT_LATE_LOST,       /* late for a period no longer held: not counted */
	TM_STAT_ORIGINAL_FULL,   /* no room to remember a flow's own colour bit */
	TM_STAT_DROPS,           /* drops the kernel reported (all flows) */
	TM_STAT_DROPS_UNPARSED,  /* of those, not IPv4/IPv6 */
	TM_STAT_DROPS_FULL,      /* no room in "drops" for the flow */
	TM_STAT_UNATTACHED,      /* a hook ran on an interface not in "ports" (detached) */
	TM_STAT_OVERRUN,         /* a period user space had not read was overwritten */
	TM_STAT_QUEUE_UNCOUNTED, /* dropped by the egress queue after its egress point counted it */
	TM_STAT_QUEUE_MISSED,    /* such a drop whose count was no longer there to take back */
	TM_STAT_SAMPLED,         /* packets sampled for sFlow */
	TM_STAT_SAMPLE_LOST,     /* of those, not sent: no room in the perf buffer */
	TM_STAT_NEW_KEY_LOST,    /* a key new in "counts" not announced: no room in "new_keys" */
	TM_STAT_OWN_COLOUR,      /* left as the sender coloured them, not measured (TM_OWN_KEEP) */
	TM_STAT_HELD,            /* a new flow's first packet held back from colour 1 */
	TM_STAT_UNSURE,          /* a flow an exit first saw with the colour bit: left as it is */
	TM_STAT_COUNT,
};

/* Drop reasons counted per reason (enum skb_drop_reason is smaller on every kernel so far;
 * larger values are counted in the last slot). */
#define TM_REASONS 512

/* Where the kernel drops a packet for a reason, as far as the points are concerned (map
 * "drop_places", by reason; set by user space from the kernel's BTF). */
enum tm_drop_place {
	TM_DROP_BEFORE_EGRESS = 0, /* before the egress hook: the packet was never counted out */
	TM_DROP_EGRESS_QUEUE = 1,  /* in the egress queue (a qdisc), after the egress hook */
	TM_DROP_NOT_LOSS = 2,      /* a copy the host was not meant to keep (OTHERHOST after a
				    * packet socket took its own): counted per reason only */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TM_PORT_SLOTS);
	__type(key, __u32);
	__type(value, struct tm_port_slot);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tm_settings);
} settings SEC(".maps");

/* Sized by the agent at load ([ebpf] flows). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tm_key);
	__type(value, struct tm_slots);
} counts SEC(".maps");

/* Keys new in "counts", as the programs created them: user space reads the counters of the
 * keys it knows of, rather than walk the whole map each period (a walk visits every bucket,
 * 16 bytes for each flow the map can hold, however few it has). A key that finds no room here
 * is counted (TM_STAT_NEW_KEY_LOST), and user space then walks the map once. No wakeups: user
 * space reads it on its own schedule. Sized by the agent at load. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} new_keys SEC(".maps");

/* Flows whose own DSCP had the colour bit set when they were last marked (value unused); LRU,
 * so a full map forgets the longest-quiet flow's bit, never refuses a new one. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct tm_key);
	__type(value, __u8);
} original SEC(".maps");

/* TM_OWN_KEEP: packets each flow's sender sent with the colour bit set, at the marker (key: the
 * flow at the marker's point, colour 0); read by user space, which names the flows in their
 * records. LRU, so a full map forgets the longest-quiet flow, never refuses a new one. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct tm_key);
	__type(value, __u64);
} own SEC(".maps");

/* TM_OWN_KEEP: flows whose first packet at an exit had the colour bit (key: the flow at the
 * exit's point, colour 0; value unused). A marker never sends a new flow's first packet with
 * the bit, so such a flow's bit is its sender's: the exit leaves it, until it sees a packet of
 * the flow without it (then the flow was marked after all: its first packets were lost or
 * passed before this exit was attached). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct tm_key);
	__type(value, __u8);
} unsure SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct tm_drop_key);
	__type(value, __u64);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TM_REASONS);
	__type(key, __u32);
	__type(value, __u64);
} reasons SEC(".maps");

/* The last period user space has read everywhere (a slot of a later one overwritten before
 * it was read is an overrun). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} reader SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TM_REASONS);
	__type(key, __u32);
	__type(value, __u8); /* enum tm_drop_place */
} drop_places SEC(".maps");

/* Flows refused for lack of room in "counts", per point. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u64);
} refused SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TM_STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* sFlow's sampler at one ingress point, on one CPU (map "samplers", by point). */
struct tm_sampler {
	__u64 pool; /* packets it could have sampled (sFlow's sample_pool, summed over CPUs) */
	__u32 skip; /* packets before the next sample */
	__u32 lost; /* samples not sent: no room in the perf buffer (sFlow's drops) */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct tm_sampler);
} samplers SEC(".maps");

/* What precedes a sampled packet's bytes in the perf buffer "samples". */
struct tm_sample {
	__u32 ifindex;
	__u32 frame_len;  /* a wire frame's length (a GSO or GRO skb's over its packets) */
	__u32 header_len; /* bytes of the packet that follow */
	__u8 in_point;
	__u8 pad[3];
};

/* One buffer per CPU (the loader sizes it). */
struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} samples SEC(".maps");

static __always_inline void bump(__u32 stat)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &stat);
	if (v)
		*v += 1;
}

/* The DSCP bit, as a mask of the IPv4 TOS byte / the IPv6 traffic class. */
static __always_inline __u8 tos_mask(__u8 colour_bit)
{
	return (__u8)(1u << (colour_bit + 2));
}

static __always_inline int colour_of(struct tm_ip *ip, void *end, __u8 mask)
{
	if (ip->version == 4) {
		struct iphdr *h = ip->l3;
		if ((void *)(h + 1) > end)
			return 0;
		return (h->tos & mask) != 0;
	}
	__u8 *b = ip->l3;
	if ((void *)(b + 2) > end)
		return 0;
	__u8 tclass = (__u8)((b[0] << 4) | (b[1] >> 4));
	return (tclass & mask) != 0;
}

/* Sets the colour bit to `on`; returns whether the packet changed. Written through helpers, not
 * direct packet access: a program that writes packets directly makes the kernel unclone every
 * skb it runs on before it starts (TCP's are clones), while a helper copies a shared header
 * only for the packets it changes. IPv4: the header checksum updated incrementally (RFC 1624);
 * the two changes cancel in a CHECKSUM_COMPLETE sum. IPv6: no header checksum, so the
 * complete sum is updated (BPF_F_RECOMPUTE_CSUM). Packet pointers are invalid afterwards. */
static __always_inline int set_colour(struct __sk_buff *skb, struct tm_ip *ip, void *end,
				      __u8 mask, int on)
{
	if (ip->version == 4) {
		struct iphdr *h = ip->l3;
		if ((void *)(h + 1) > end)
			return 0;
		__u8 tos = on ? (h->tos | mask) : (h->tos & ~mask);
		if (tos == h->tos)
			return 0;
		__u16 old = *(__u16 *)h; /* version/IHL and TOS: one 16-bit word of the sum */
		__u8 word[2] = { ((__u8 *)h)[0], tos };
		__u16 next = *(__u16 *)word;
		__u32 off = ip->l3_offset;
		if (bpf_l3_csum_replace(skb, off + offsetof(struct iphdr, check), old, next, 2) != 0)
			return 0;
		return bpf_skb_store_bytes(skb, off + offsetof(struct iphdr, tos), &tos, 1, 0) == 0;
	}
	__u8 *b = ip->l3;
	if ((void *)(b + 2) > end)
		return 0;
	/* Traffic class: the low nibble of byte 0 and the high nibble of byte 1. */
	__u8 tclass = (__u8)((b[0] << 4) | (b[1] >> 4));
	__u8 next = on ? (tclass | mask) : (tclass & ~mask);
	if (next == tclass)
		return 0;
	__u8 bytes[2] = { (b[0] & 0xf0) | (next >> 4), (b[1] & 0x0f) | (__u8)(next << 4) };
	return bpf_skb_store_bytes(skb, ip->l3_offset, bytes, 2, BPF_F_RECOMPUTE_CSUM) == 0;
}

/* The marking periods as a hook sees them: from its port's slot, or the drop program from the
 * settings. */
struct tm_periods {
	__u64 period_ns;
	__u64 guard_ns;
	__u64 *seen; /* the period a packet was last seen in, in the slot or the settings */
};

static __always_inline struct tm_periods slot_periods(struct tm_port_slot *p)
{
	return (struct tm_periods){ p->period_ns, p->guard_ns, &p->period_seen };
}

/* The period `now` is in (RFC 9341 §3.2: k = floor(t / T)). A 64-bit division costs about a
 * packet's 13 ns, so the last period seen is kept and tried first: while `now` is in it, one
 * multiplication tells. All CPUs write the same value once a period; a value another CPU wrote
 * meanwhile, older or newer, fails the test and is computed again. */
static __always_inline __u64 period_at(__u64 now, struct tm_periods t)
{
	__u64 k = *t.seen;
	if (tm_likely(now - k * t.period_ns < t.period_ns))
		return k;
	k = now / t.period_ns;
	*t.seen = k;
	return k;
}

/* The period a packet of colour `colour` seen at `now` belongs to. A packet of the other
 * colour than the current period's is a straggler of the period before within the guard after
 * it began, early for the next one within as long before that one begins (this host's clock
 * behind the marker's), and late in between (`*late` set; the period before). */
static __always_inline __u64 period_of(__u64 now, __u8 colour, struct tm_periods t, int *late)
{
	__u64 k_now = period_at(now, t);
	*late = 0;
	if (tm_likely((k_now & 1) == colour))
		return k_now;
	__u64 off = now - k_now * t.period_ns;
	__u64 early = t.period_ns - t.guard_ns;
	if (early > t.guard_ns)
		early = t.guard_ns;
	if (off < t.guard_ns)
		return k_now - 1;
	if (off >= t.period_ns - early)
		return k_now + 1;
	*late = 1;
	return k_now - 1;
}

/* The IPv4 TTL or IPv6 hop limit: each routed hop takes one off, so points further down a
 * routed path see fewer (0 if the header is short). */
static __always_inline __u8 hops_of(struct tm_ip *ip, void *end)
{
	if (ip->version == 4) {
		struct iphdr *h = ip->l3;
		if ((void *)(h + 1) > end)
			return 0;
		return h->ttl;
	}
	__u8 *b = ip->l3;
	if ((void *)(b + 8) > end)
		return 0;
	return b[7];
}

/* A key new in "counts", as announced in "new_keys": with the TTL (hop limit) of the packet
 * that created it, which tells hosts along a routed path apart where their counts cannot. */
struct tm_new_key {
	struct tm_key key;
	__u8 ttl;
	__u8 pad[7];
};

/* Now, in Unix time (BPF has no CLOCK_REALTIME; TAI moves with it, the TAI offset apart). */
static __always_inline __u64 unix_now(const struct tm_port_slot *p)
{
	return bpf_ktime_get_tai_ns() - (__u64)p->tai_offset_s * 1000000000ull;
}

/* What count() did. */
enum tm_counted {
	TM_COUNTED = 0,     /* counted, in counters the flow had here */
	TM_COUNTED_NEW = 1, /* counted, in counters it created: the flow's first packet of the
			     * colour here */
	TM_HELD = 2,        /* not counted: the first packet of a flow new here, of colour 1,
			     * where the caller holds such packets back (it counts them as
			     * colour 0) */
	TM_REFUSED = 3,     /* not counted: no room in "counts" */
};

/* Counts `segs` packets of colour `colour` at `point` of port `p`: in the period they belong
 * to, or as late. `now`: the point's clock; the period of a packet that creates counters is
 * told by the fine clock instead, so that every point places a flow's first packet alike (a
 * marker's held packet has only its time to tell its period by). Its time stays the point's
 * clock's, as every other packet's there (a batch never ends before it begins). `ttl`: the
 * packet's (hops_of), announced with a key it creates. `hold`: a packet of colour 1 of a flow
 * with no counters here in either colour is not counted (TM_HELD). */
static __always_inline enum tm_counted count(struct tm_key *k, __u8 point, __u8 colour,
					     __u32 len, __u32 segs, __u64 now,
					     struct tm_port_slot *p, __u8 ttl, int hold)
{
	struct tm_periods t = slot_periods(p);
	enum tm_counted done = TM_COUNTED;
	__u64 when = now; /* what tells the period */
	k->point = point;
	k->colour = colour;
	struct tm_slots *v = bpf_map_lookup_elem(&counts, k);
	if (tm_unlikely(!v)) {
		if (hold && colour == 1) {
			k->colour = 0;
			int known = bpf_map_lookup_elem(&counts, k) != 0;
			k->colour = colour;
			if (!known)
				return TM_HELD;
		}
		struct tm_slots fresh = {};
		if (bpf_map_update_elem(&counts, k, &fresh, BPF_NOEXIST) != 0) {
			v = bpf_map_lookup_elem(&counts, k);
			if (!v) {
				__u32 p = point;
				__u64 *n = bpf_map_lookup_elem(&refused, &p);
				if (n)
					*n += 1;
				bump(TM_STAT_REFUSED);
				return TM_REFUSED;
			}
		} else {
			done = TM_COUNTED_NEW;
			when = unix_now(p);
			struct tm_new_key announced = { .key = *k, .ttl = ttl };
			if (bpf_ringbuf_output(&new_keys, &announced, sizeof(announced),
					       BPF_RB_NO_WAKEUP) != 0)
				bump(TM_STAT_NEW_KEY_LOST);
			v = bpf_map_lookup_elem(&counts, k);
			if (!v)
				return TM_REFUSED;
		}
	}
	int late;
	__u64 period = period_of(when, colour, t, &late);
	if (tm_unlikely(late)) {
		bump(TM_STAT_LATE);
		if (v->cur.period == period)
			v->cur.late += segs;
		else if (v->prev.period == period)
			v->prev.late += segs;
		else
			bump(TM_STAT_LATE_LOST);
		return done;
	}
	if (tm_unlikely(v->cur.period != period)) {
		if (v->prev.packets) {
			__u32 zero = 0;
			__u64 *read = bpf_map_lookup_elem(&reader, &zero);
			if (read && v->prev.period > *read)
				bump(TM_STAT_OVERRUN);
		}
		if (v->cur.packets || v->cur.late)
			v->prev = v->cur;
		v->cur.period = period;
		v->cur.packets = 0;
		v->cur.bytes = 0;
		v->cur.late = 0;
		v->cur.first_ns = now;
	}
	v->cur.packets += segs;
	v->cur.bytes += len;
	v->cur.last_ns = now;
	return done;
}

/* TM_OWN_KEEP at a marker: `segs` packets of `flow` its sender sent with the colour bit set,
 * left as they are and counted in "own" at `point`. */
static __always_inline void leave_own(const struct tm_key *flow, __u8 point, __u32 segs)
{
	struct tm_key o = *flow;
	o.point = point;
	o.colour = 0;
	bump(TM_STAT_OWN_COLOUR);
	__u64 *n = bpf_map_lookup_elem(&own, &o);
	if (n) {
		*n += segs;
		return;
	}
	__u64 first = segs;
	if (bpf_map_update_elem(&own, &o, &first, BPF_NOEXIST) == 0)
		return;
	n = bpf_map_lookup_elem(&own, &o); /* another CPU created it meanwhile */
	if (n)
		*n += segs;
}

/* TM_OWN_KEEP at an exit: whether a packet of `flow` leaving at `point` keeps the colour bit
 * (`bit`: it has it). `counted`: what count() did with it. A flow whose first packet here had
 * the bit (new counters of colour 1, none of colour 0) has it from its sender, since a marker
 * holds a new flow's first packet back from colour 1: it is left in "unsure", whose packets
 * keep the bit until one comes without it (the flow was marked after all). */
static __always_inline int keeps_bit(const struct tm_key *flow, __u8 point, int bit,
				     enum tm_counted counted, struct tm_settings *s)
{
	struct tm_key u = *flow;
	u.point = point;
	u.colour = 0;
	if (tm_unlikely(bit && counted == TM_COUNTED_NEW) && !bpf_map_lookup_elem(&counts, &u)) {
		__u8 one = 1;
		if (bpf_map_update_elem(&unsure, &u, &one, BPF_ANY) == 0) {
			s->restore = TM_RESTORE_SOME;
			bump(TM_STAT_UNSURE);
			return 1;
		}
	}
	if (tm_likely(s->restore != TM_RESTORE_SOME) || !bpf_map_lookup_elem(&unsure, &u))
		return 0;
	if (bit)
		return 1;
	bpf_map_delete_elem(&unsure, &u);
	return 0;
}

/* Takes back `segs` packets (`len` bytes) of colour `colour` that `point`, an egress point,
 * counted and its interface's egress queue then dropped: they never left, so the host lost
 * them (its inside segment), and the queue's drop reason names it. Returns whether it could:
 * drops that come after their period was read, or of packets counted late, are left as they
 * are (then the link after the point shows them). */
static __always_inline int uncount(struct tm_key *k, __u8 point, __u8 colour, __u32 len,
				   __u32 segs, __u64 now, struct tm_periods t)
{
	int late;
	__u64 period = period_of(now, colour, t, &late);
	k->point = point;
	k->colour = colour;
	struct tm_slots *v = bpf_map_lookup_elem(&counts, k);
	struct tm_batch *b = 0;
	if (v && !late) {
		if (v->cur.period == period)
			b = &v->cur;
		else if (v->prev.period == period)
			b = &v->prev;
	}
	/* Another CPU may have counted it: this CPU's count is taken from only if it has as many
	 * (user space sums the CPUs). */
	if (!b || b->packets < segs || b->bytes < len)
		return 0;
	b->packets -= segs;
	b->bytes -= len;
	return 1;
}

/* The most samples one skb gives (a GSO or GRO skb of many segments at a low rate). */
#define TM_SAMPLES_PER_SKB 64

/* sFlow v5's packet sampling (sFlow v5 §4, "Packet Flow Sampling"): of the packets arriving at
 * `point`, one in `sample_rate` at random, each gap drawn uniformly from 1 .. 2N - 1 (mean N).
 * A GSO or GRO skb is its segments: they all add to the pool, every gap that ends inside it
 * gives a sample of it (its segments share their headers), and the segments after the last
 * one start the next gap. */
static __always_inline void sample(struct __sk_buff *skb, __u8 point,
				   const struct tm_port_slot *s)
{
	__u32 p = point;
	struct tm_sampler *sm = bpf_map_lookup_elem(&samplers, &p);
	if (!sm)
		return;
	__u32 segs = wire_packets(skb);
	sm->pool += segs;
	if (sm->skip > segs) {
		sm->skip -= segs;
		return;
	}
	__u64 rate = s->sample_rate;
	__u64 n = skb->len < s->sample_bytes ? skb->len : s->sample_bytes;
	struct tm_sample meta = {
		.ifindex = skb->ifindex,
		.frame_len = skb->len / segs,
		.header_len = (__u32)n,
		.in_point = point,
	};
	__u32 left = segs;
	for (int i = 0; i < TM_SAMPLES_PER_SKB; i++) {
		if (sm->skip > left) {
			sm->skip -= left;
			return;
		}
		left -= sm->skip;
		sm->skip = rate > 1 ? 1 + (__u32)(bpf_get_prandom_u32() % (2 * rate - 1)) : 1;
		bump(TM_STAT_SAMPLED);
		if (bpf_perf_event_output(skb, &samples, BPF_F_CURRENT_CPU | (n << 32), &meta,
					  sizeof(meta)) != 0) {
			sm->lost += 1;
			bump(TM_STAT_SAMPLE_LOST);
		}
	}
}

/* Now on the tick clock: Unix time to within a tick, from the kernel's jiffies, which the
 * verifier turns into one load of a variable the network stack reads all the time (under TCP
 * load, the clock helpers cost 15-30 ns a packet more: their timekeeper's lines are cold).
 * Jiffies count ticks of tick_ns on the monotonic clock, so jiffies * tick_ns is Unix time
 * less an offset that moves only when the clock is set: the first packet of each tick here
 * takes it again from the fine clock (a few hundred times a second), so a packet gets the
 * time of its tick's first one at its port, up to a tick behind its own. Another CPU may read
 * the new tick with the offset of an earlier one, which was as good to within a tick; a
 * tick's error, either way, is what user space allows for when it picks this clock. An
 * offset of 0 (user space's, when it writes the slot) is taken again. */
static __always_inline __u64 tick_now(struct tm_port_slot *p)
{
	__u64 ticks = bpf_jiffies64();
	__u64 base = ticks * p->tick_ns;
	if (tm_unlikely((__u16)ticks != p->tick_seen || p->tick_offset_ns == 0)) {
		p->tick_offset_ns = unix_now(p) - base;
		p->tick_seen = (__u16)ticks;
	}
	return base + p->tick_offset_ns;
}

/* Now for a counting point: the tick clock where it is precise enough (enum tm_clock). */
static __always_inline __u64 count_now(struct tm_port_slot *p)
{
	if (p->clock == TM_CLOCK_TICK)
		return tick_now(p);
	return unix_now(p);
}

static __always_inline struct tm_settings *get_settings(void)
{
	__u32 zero = 0;
	struct tm_settings *s = bpf_map_lookup_elem(&settings, &zero);
	if (!s || s->period_ns == 0)
		return 0;
	return s;
}

/* The slot of the interface with index `ifindex`, if it is attached and set. */
static __always_inline struct tm_port_slot *port_of(__u32 ifindex)
{
	__u32 slot = ifindex % TM_PORT_SLOTS;
	struct tm_port_slot *p = bpf_map_lookup_elem(&ports, &slot);
	if (tm_unlikely(!p || p->ifindex != ifindex || p->period_ns == 0))
		return 0;
	return p;
}

SEC("classifier")
int tm_ingress(struct __sk_buff *skb)
{
	struct tm_port_slot *port = port_of(skb->ifindex);
	if (tm_unlikely(!port)) {
		bump(TM_STAT_UNATTACHED);
		return TC_ACT_UNSPEC;
	}
	/* Every frame, as it arrived (before a marker colours it). */
	if (tm_unlikely(port->sample_rate && port->port.in_point != TM_NO_POINT))
		sample(skb, port->port.in_point, port);
	struct tm_key k = {};
	struct tm_ip ip = {};
	if (tm_unlikely(parse(skb, &ip, &k) != 0)) {
		bump(TM_STAT_NOT_IP);
		return TC_ACT_UNSPEC;
	}
	void *end = (void *)(long)skb->data_end;
	__u8 mask = tos_mask(port->colour_bit);
	__u8 ttl = hops_of(&ip, end);
	__u64 now;
	__u8 colour;
	if (tm_unlikely(port->port.in_action == TM_IN_MARK)) {
		/* The marker's colour changes on the period's edge: the fine clock. */
		now = unix_now(port);
		colour = period_at(now, slot_periods(port)) & 1;
		int keep = port->own_colour == TM_OWN_KEEP;
		if (tm_unlikely(colour_of(&ip, end, mask)) && keep) {
			/* The sender's own bit: left as it is, not measured. */
			leave_own(&k, port->port.in_point, wire_packets(skb));
			return TC_ACT_UNSPEC;
		}
		if (keep) {
			/* Counted before it is coloured: a new flow's first packet of colour 1 is
			 * held back to colour 0 (and counted so, as every point will), unless it
			 * finds no room there either (a flow the marker cannot measure is still
			 * coloured by its period, for the points after it). */
			if (port->port.in_point != TM_NO_POINT &&
			    count(&k, port->port.in_point, colour, skb->len, wire_packets(skb), now,
				  port, ttl, 1) == TM_HELD &&
			    count(&k, port->port.in_point, 0, skb->len, wire_packets(skb), now, port,
				  ttl, 0) != TM_REFUSED) {
				colour = 0;
				bump(TM_STAT_HELD);
			}
			set_colour(skb, &ip, end, mask, colour);
			bump(TM_STAT_MARKED);
			return TC_ACT_UNSPEC;
		}
		if (tm_unlikely(colour_of(&ip, end, mask))) {
			/* The flow's own DSCP has the bit: remember it for the exit (rare). */
			__u8 one = 1;
			struct tm_settings *s = get_settings();
			if (bpf_map_update_elem(&original, &k, &one, BPF_ANY) != 0) {
				bump(TM_STAT_ORIGINAL_FULL);
			} else {
				/* The settings' first (the exits read it, and user space copies it
				 * into every slot it rewrites), then this marker's own. */
				if (s)
					s->restore = TM_RESTORE_SOME;
				port->restore = TM_RESTORE_SOME;
			}
		} else if (port->restore == TM_RESTORE_SOME) {
			/* It no longer has it (or never had: the same ports reused by a new flow). */
			bpf_map_delete_elem(&original, &k);
		}
		set_colour(skb, &ip, end, mask, colour);
		bump(TM_STAT_MARKED);
	} else {
		now = count_now(port);
		colour = colour_of(&ip, end, mask);
	}
	if (port->port.in_point != TM_NO_POINT)
		count(&k, port->port.in_point, colour, skb->len, wire_packets(skb), now,
		      port, ttl, 0);
	return TC_ACT_UNSPEC;
}

SEC("classifier")
int tm_egress(struct __sk_buff *skb)
{
	struct tm_port_slot *port = port_of(skb->ifindex);
	if (tm_unlikely(!port)) {
		bump(TM_STAT_UNATTACHED);
		return TC_ACT_UNSPEC;
	}
	struct tm_key k = {};
	struct tm_ip ip = {};
	if (tm_unlikely(parse(skb, &ip, &k) != 0)) {
		bump(TM_STAT_NOT_IP);
		return TC_ACT_UNSPEC;
	}
	void *end = (void *)(long)skb->data_end;
	__u8 mask = tos_mask(port->colour_bit);
	__u8 colour = colour_of(&ip, end, mask);
	__u8 ttl = hops_of(&ip, end);
	struct tm_key flow = k;
	enum tm_counted counted = TM_REFUSED;
	if (port->port.out_point != TM_NO_POINT)
		counted = count(&k, port->port.out_point, colour, skb->len, wire_packets(skb),
				count_now(port), port, ttl, 0);
	if (tm_unlikely(port->port.out_action == TM_OUT_UNMARK)) {
		struct tm_settings *s = get_settings();
		if (!s)
			return TC_ACT_UNSPEC;
		int own = 0;
		if (port->own_colour == TM_OWN_KEEP)
			own = keeps_bit(&flow, port->port.out_point, colour, counted, s);
		else if (s->restore == TM_RESTORE_SOME && bpf_map_lookup_elem(&original, &flow))
			own = 1;
		if (set_colour(skb, &ip, end, mask, own))
			bump(TM_STAT_UNMARKED);
	}
	return TC_ACT_UNSPEC;
}

/* The parts of the kernel's structures read here; CO-RE finds them in the running kernel's
 * layout. */
struct net {
	__u64 net_cookie;
} __attribute__((preserve_access_index));

typedef struct {
	struct net *net;
} possible_net_t;

struct net_device {
	int ifindex;
	possible_net_t nd_net;
} __attribute__((preserve_access_index));

struct skb_shared_info {
	unsigned short gso_segs;
} __attribute__((preserve_access_index));

struct sk_buff {
	struct net_device *dev;
	unsigned int end;
	unsigned char *head;
	__u16 network_header;
	__u16 protocol;
	unsigned int len;
} __attribute__((preserve_access_index));

/* Where a drop happened: the device the packet was on, by namespace and index. */
struct tm_drop_port {
	__u64 netns; /* the namespace's cookie (SO_NETNS_COOKIE) */
	__u32 ifindex;
	__u32 pad;
};

/* The attached interfaces as the drop program tells them apart (the tc programs cannot see a
 * device's namespace; the tracepoint can). Value: the port, as in "ports". */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct tm_drop_port);
	__type(value, struct tm_port);
} drop_ports SEC(".maps");

SEC("tp_btf/kfree_skb")
int tm_drop(__u64 *ctx)
{
	struct sk_buff *skb = (struct sk_buff *)ctx[0];
	__u32 reason = (__u32)ctx[2];
	__u32 zero = 0;
	struct tm_settings *s = bpf_map_lookup_elem(&settings, &zero);
	if (s && reason == s->consumed_reason)
		return 0;
	/* A GSO or GRO skb dropped whole: as many packets as it stands for. */
	unsigned char *head = skb->head;
	struct skb_shared_info *shinfo = (struct skb_shared_info *)(head + skb->end);
	__u16 segs = 0;
	bpf_probe_read_kernel(&segs, sizeof(segs), &shinfo->gso_segs);
	__u64 packets = segs ? segs : 1;
	bump(TM_STAT_DROPS);
	__u32 slot = reason < TM_REASONS ? reason : TM_REASONS - 1;
	__u64 *n = bpf_map_lookup_elem(&reasons, &slot);
	if (n)
		*n += packets;

	__u32 r = slot;
	__u8 *place = bpf_map_lookup_elem(&drop_places, &r);
	if (place && *place == TM_DROP_NOT_LOSS)
		return 0;

	/* Only drops on this agent's interfaces are its flows' drops. */
	struct net_device *dev = skb->dev;
	if (!dev)
		return 0;
	struct tm_drop_port where = { .netns = dev->nd_net.net->net_cookie, .ifindex = dev->ifindex };
	struct tm_port *port = bpf_map_lookup_elem(&drop_ports, &where);
	if (!port)
		return 0;

	__u16 nh = skb->network_header;
	__u16 proto = skb->protocol;
	/* A copy of the headers (IPv6 and the ports: 44 bytes, IPv4 with options: up to 64). */
	__u8 buf[64] = {};
	if (bpf_probe_read_kernel(buf, sizeof(buf), head + nh) != 0) {
		bump(TM_STAT_DROPS_UNPARSED);
		return 0;
	}
	struct tm_drop_key dk = {};
	int ok = -1;
	if (proto == bpf_htons(ETH_P_IP) && (buf[0] >> 4) == 4)
		ok = key_v4((struct iphdr *)buf, buf + sizeof(buf), &dk.flow);
	else if (proto == bpf_htons(ETH_P_IPV6) && (buf[0] >> 4) == 6)
		ok = key_v6((struct ipv6hdr *)buf, buf + sizeof(buf), &dk.flow);
	if (ok != 0) {
		bump(TM_STAT_DROPS_UNPARSED);
		return 0;
	}
	if (s && s->period_ns && place && *place == TM_DROP_EGRESS_QUEUE &&
	    port->out_point != TM_NO_POINT) {
		struct tm_ip ip = { .l3 = buf, .version = buf[0] >> 4 };
		__u8 colour = colour_of(&ip, buf + sizeof(buf), tos_mask(s->colour_bit));
		struct tm_key k = dk.flow;
		struct tm_periods t = { s->period_ns, s->guard_ns, &s->period_seen };
		/* The fine clock (tracing programs have no port slot to keep a tick clock in); the
		 * counting point's tick of error is well inside the guard period_of() allows. */
		__u64 now = bpf_ktime_get_tai_ns() - s->tai_offset_ns;
		int done;
		if (port->out_action == TM_OUT_UNMARK) {
			/* The exit gave the packet its own DSCP bit back, so the colour it was
			 * counted in is not in it. It was counted moments ago: in the current
			 * period's colour, or, a straggler, the other. */
			__u8 current = period_at(now, t) & 1;
			done = uncount(&k, port->out_point, current, skb->len, packets, now, t) ||
			       uncount(&k, port->out_point, current ^ 1, skb->len, packets, now, t);
		} else {
			done = uncount(&k, port->out_point, colour, skb->len, packets, now, t);
		}
		bump(done ? TM_STAT_QUEUE_UNCOUNTED : TM_STAT_QUEUE_MISSED);
	}
	dk.reason = reason;
	__u64 *c = bpf_map_lookup_elem(&drops, &dk);
	if (c) {
		*c += packets;
		return 0;
	}
	if (bpf_map_update_elem(&drops, &dk, &packets, BPF_NOEXIST) == 0)
		return 0;
	/* Another CPU created the key between the lookup and the update: add to it. */
	c = bpf_map_lookup_elem(&drops, &dk);
	if (c)
		*c += packets;
	else
		bump(TM_STAT_DROPS_FULL);
	return 0;
}
