"""The report's figures, one module per family; each builds matplotlib Figure objects through
analysis.figures.common (the house style, colours, footer, saving) and imports only the data
it draws (analysis.runs, stats, cost, training, contention, scaling, analysis.model):

    bandwidth    Figure 1, write and restore bandwidth against tensor size
    stall        Figure 2, stall against SSD count beside the model
    host         Figures 3 and 9, host memory and the host's CPU per engine
    feasibility  Figure 4, GDS stall / CPU-centric stall and CPU-centric / GDS restore per
                 hardware profile
    timeline     Figure 5, one checkpoint's phases per engine
    training     Figure 6, step times of a training loop
    contention   Figure 7, many ranks at once
    planning     Figure 8, training time lost against the MTBF
    scaling      Figures 10 and 11, cost and host memory against checkpoint size
    restore      Figure 12, restore bandwidth against tensor size and SSD count, read ceilings
    compare      `ckptbench compare`'s figure

A new figure goes into its family's module, or a new module beside them.
"""
