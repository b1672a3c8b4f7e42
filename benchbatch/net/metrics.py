"""What a server's Prometheus /metrics page says that a prediction uses (vLLM's names).

vLLM serves its CacheConfig as the labels of a gauge, vllm:cache_config_info (block_size,
num_gpu_blocks: the KV pool its scheduler hands out), and counts preemptions in
vllm:num_preemptions_total. Read with prometheus_client's parser; a server without the page
or the names (SGLang, TGI, benchbatch serve) gives {}.
"""

from __future__ import annotations

import asyncio
import math

import aiohttp

KV_INFO = "vllm:cache_config_info"  # a gauge of 1 whose labels are vLLM's CacheConfig
PREEMPTIONS = "vllm:num_preemptions"  # a counter (its sample is ..._total)


async def read(session: aiohttp.ClientSession, url: str) -> dict:
    """GET url (a /metrics page) and parse() it; {} for no page, an error or no answer."""
    try:
        async with session.get(url) as resp:
            text = await resp.text(errors="replace") if resp.status == 200 else ""
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return {}
    return parse(text)


def parse(text: str) -> dict:
    """kv_block_size and kv_blocks (cache_config_info's block_size and num_gpu_blocks; the
    first engine's where there are several) and preemptions (num_preemptions_total summed
    over engines): keys only for what the page has; {} for text that is not Prometheus's."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError):  # not Prometheus text
        return {}
    for family in families:
        if family.name == KV_INFO and "kv_blocks" not in out:
            for sample in family.samples:
                size = _whole(sample.labels.get("block_size"))
                blocks = _whole(sample.labels.get("num_gpu_blocks"))
                if size and blocks:
                    out |= {"kv_block_size": size, "kv_blocks": blocks}
                    break
        elif family.name == PREEMPTIONS and family.type == "counter":
            totals = [s.value for s in family.samples if s.name.endswith("_total")]
            if totals and all(math.isfinite(v) and v >= 0 for v in totals):
                out["preemptions"] = int(sum(totals))
    return out


def _whole(value: str | None) -> int | None:
    return int(value) if isinstance(value, str) and value.isdigit() and int(value) > 0 else None
