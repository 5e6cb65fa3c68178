"""The lake in the broker process: the tiering coordinator, lake tables created as soon as a
table is lake-enabled, and (`--lake-tiering`) the tiering worker for a single machine."""
from __future__ import annotations

import asyncio
import logging

from fluvial.broker.broker import on_start, on_stop
from fluvial.tiering.lake.catalog import catalog_properties
from fluvial.tiering.lake.coordinator import LakeCoordinator, lake_enabled

log = logging.getLogger(__name__)


@on_start
async def start_lake(broker) -> None:
    props = catalog_properties(broker.data_dir, broker.config.lake_catalog_options)
    coordinator = LakeCoordinator(broker, props, broker.config.lake_lease_ms)
    broker.extensions["lake"] = coordinator
    loop = asyncio.get_running_loop()

    def ensure(table) -> None:
        # A lake table that cannot be made now (catalog unreachable) is made by the next round.
        if not lake_enabled(table):
            return
        try:
            coordinator.ensure_table(table)
        except Exception:
            log.exception("lake table of %s could not be created (retried by the next round)", table.name)

    # Open hooks run on the I/O executor: the lake table exists once the table does.
    broker.tables.open_hooks.append(ensure)
    # Altered and deleted hooks run on the event loop: catalog I/O goes to the executor.
    broker.tables.altered_hooks.append(lambda table: loop.run_in_executor(broker.io_executor, ensure, table))
    broker.tables.deleted_hooks.append(lambda table: loop.run_in_executor(
        broker.io_executor, coordinator.forget, table.name))
    await loop.run_in_executor(broker.io_executor,
                               lambda: [ensure(t) for t in list(broker.tables.tables.values())])


@on_start
async def start_lake_tiering(broker) -> None:
    """Started after the table API (it is this worker's way in), when asked for."""
    if not broker.config.lake_tiering:
        return
    from fluvial.broker.flight.auth import internal_connection
    from fluvial.tiering.lake.job import TieringWorker

    # Through the table API like any job; on a secured one as the broker itself.
    url, security = internal_connection(broker)
    worker = TieringWorker(url, job=f"broker-{broker.config.node_id}",
                           catalog_options=dict(broker.config.lake_catalog_options), security=security)
    worker.start_thread()
    broker.extensions["lake_worker"] = worker
    log.info("lake tiering runs in the broker")


@on_stop
async def stop_lake(broker) -> None:
    worker = broker.extensions.pop("lake_worker", None)
    if worker is not None:
        await asyncio.to_thread(worker.stop)
