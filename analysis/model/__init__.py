"""The analytical model, by job, each module importing only those before it:

profiles   the inputs: hardware profiles (configs/hardware/*.yaml), the reference CPU cost
predict    stall, time to durability and host memory of each engine; the GDS break-even
host       what checkpointing at the SSDs' rate costs the host (cores, DRAM bandwidth)
planning   how often to checkpoint (Young/Daly) and the time lost
calibrate  'this machine' from a measured run's ceilings
published  the model against published GPU-server measurements (configs/published.yaml)
render     what `ckptbench model` prints: text tables and the plan's JSON
"""
