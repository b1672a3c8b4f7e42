"""Run a benchbatch command with the model's weight layout forced instead of measured.

benchbatch chooses the layout of the projection weights per process by timing them
(runtime/layout.py); a study of how the step costs follow the layout (docs/simulation.md,
"Two regimes") needs runs in a given one. Nothing here is a test or a default: a tool for
such measurements; metadata.json's weight_layout records what the run had.

    python scripts/with_layout.py rows-split serve-sweep --preset cpu-small --out DIR
    (layouts: rows-fused, rows-split, columns-fused, columns-split, and packed where
    the CPU and dtype have oneDNN's prepacked linear: packed at the row floor measured
    for the model here, as the chooser would take it; packed-unpadded with none)
"""

from __future__ import annotations

import sys

from benchbatch.runtime import layout

NAMES = {f"{'columns' if c.columns else 'rows'}-{'split' if c.split else 'fused'}": c
         for c in layout.LAYOUTS} | {"packed": layout.PACKED,
                                     "packed-unpadded": layout.PACKED}  # fmt: skip


def main() -> None:
    usage = f"usage: with_layout.py {{{','.join(NAMES)}}} COMMAND [ARGS...]"
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(usage + "\n\n" + __doc__.strip())
        return
    if len(sys.argv) < 3 or sys.argv[1] not in NAMES:
        raise SystemExit(usage)
    name, forced = sys.argv[1], NAMES[sys.argv[1]]

    def choose(model, *args, packed: bool = True, **kwargs):
        """The forced layout (packed: at the model's measured row floor); torch.compile's
        choice (packed=False) of a forced packed one: rows (compile_model lays packed
        weights out strided)."""
        if not packed and forced.packed:
            return layout.ROWS
        if name == "packed":
            w = model.embed.weight
            return layout.WeightLayout(packed=True,
                                       floor=layout.row_floor(model.local_cfg, w.device, w.dtype))
        return forced

    layout.choose = choose
    from benchbatch.app.start import main as benchbatch

    sys.argv = ["benchbatch", *sys.argv[2:]]
    benchbatch()


if __name__ == "__main__":
    main()
