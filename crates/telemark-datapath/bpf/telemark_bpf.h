/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The little of libbpf's bpf_helpers.h the programs need, declared here so that building
 * them takes clang and the kernel's UAPI headers (linux-libc-dev) only. Helper numbers are
 * the kernel's stable ABI (enum bpf_func_id in linux/bpf.h); the map macros produce the BTF
 * map definitions (section ".maps") every loader reads.
 */
#ifndef TELEMARK_BPF_H
#define TELEMARK_BPF_H

#include <linux/types.h>
#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))
#undef __always_inline
#define __always_inline inline __attribute__((always_inline))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) __typeof__(val) *name

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value,
				   __u64 flags) = (void *)BPF_FUNC_map_update_elem;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_delete_elem;
static long (*bpf_skb_store_bytes)(struct __sk_buff *skb, __u32 offset, const void *from, __u32 len,
				   __u64 flags) = (void *)BPF_FUNC_skb_store_bytes;
static long (*bpf_l3_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to,
				   __u64 size) = (void *)BPF_FUNC_l3_csum_replace;
static long (*bpf_skb_pull_data)(struct __sk_buff *skb, __u32 len) = (void *)BPF_FUNC_skb_pull_data;
static __u64 (*bpf_ktime_get_tai_ns)(void) = (void *)BPF_FUNC_ktime_get_tai_ns;
static __u64 (*bpf_jiffies64)(void) = (void *)BPF_FUNC_jiffies64;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size,
				     const void *src) = (void *)BPF_FUNC_probe_read_kernel;
static long (*bpf_perf_event_output)(void *ctx, void *map, __u64 flags, void *data,
				     __u64 size) = (void *)BPF_FUNC_perf_event_output;
static __u32 (*bpf_get_prandom_u32)(void) = (void *)BPF_FUNC_get_prandom_u32;
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, __u64 size,
				  __u64 flags) = (void *)BPF_FUNC_ringbuf_output;

/* Branch weights: clang lays the likely path out straight and the rest after it, so a
 * packet's run fetches fewer instruction cache lines. */
#define tm_likely(x) __builtin_expect(!!(x), 1)
#define tm_unlikely(x) __builtin_expect(!!(x), 0)

#define offsetof(type, field) __builtin_offsetof(type, field)
#define bpf_htons(x) __builtin_bswap16(x)
#define bpf_ntohs(x) __builtin_bswap16(x)

#endif
