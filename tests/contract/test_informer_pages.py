"""The pod informer holds the full objects of one list page at a time, never of the whole list.

At 10k real-size pods (about 4 KB each, managedFields included) the full objects of a whole list
held until its last page arrived were ~170 MB of peak RSS (bench/bench_rss.py); transformed
page by page, only the slim pods accumulate.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from kuberay_scaler.adapters.kube.informer import Informer, Source
from kuberay_scaler.core.parse.pods import slim_pod
from kuberay_standins.apiserver import ApiServerStandIn
from tests.contract.conftest import NAMESPACE, pod, running, truth, view

pytestmark = pytest.mark.contract


def _list_requests(server: ApiServerStandIn) -> int:
    return sum(1 for r in server.requests if r.path.endswith("/pods") and "watch" not in r.query)


async def test_each_page_is_transformed_before_the_next_is_asked_for(
    apiserver: ApiServerStandIn, api: ApiClient
) -> None:
    names = [f"p{i}" for i in range(5)]
    for name in names:
        apiserver.create("pods", NAMESPACE, pod(name, node="n1"))
    pages_asked_when_transformed: dict[str, int] = {}

    def transform(obj: Any) -> Any:
        pages_asked_when_transformed[obj["metadata"]["name"]] = _list_requests(apiserver)
        return slim_pod(obj)

    informer = Informer(api, Source.pods(NAMESPACE, "rc"), page_size=2, transform=transform)
    async with running(informer.run()):
        await informer.wait_synced()
    assert set(pages_asked_when_transformed) == set(names)
    # Pages of two: p0, p1 on the first page, p2, p3 on the second, p4 on the third.
    assert [pages_asked_when_transformed[n] for n in names] == [1, 1, 2, 2, 3]
    assert view(informer.store) == truth(apiserver)
    assert all("managedFields" not in o["metadata"] for o in informer.store.values())
