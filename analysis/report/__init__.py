"""`ckptbench report RUN_DIR`: the figures, summary.csv, report.md and report.html of a run.

    build        the report's assembly: which figures, which sections in which order, the files
    doc          the small document model (Doc) rendered to Markdown and HTML
    captions     the figures' captions, and the five figures every report shows
    caveats      the loud lines at the top: what the numbers are not
    answer       "Is GDS worth it here?"
    summary      the per-case summary table
    glossary     what every column of the tables means (the row types' docs beside it)
    host         what each path costs the host
    model        the model, calibrated from the run, against the measurement
    environment  the environment the numbers come from
    training     a training-loop run (`ckptbench train`)
    contention   many ranks at once (`ckptbench run --nproc N`)
    scaling      how the cost grows with the checkpoint

Each section is a function `..._section(d, ...)` that adds its blocks to a Doc: its answer
in one sentence with the run's numbers, short lines for the caveats that change it, its figure,
then its table's first columns (the whole table under All columns); a new column gets its
glossary term. A new section is a module beside them, called from build.document. Sections import the analysis they show
(analysis.runs, stats, cost, model, training, contention, scaling), doc and captions; build
imports the sections and analysis.figures.
"""
