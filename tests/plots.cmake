# plots/: the quick sweep draws every chart, gnuplot stays silent, the index names
# them, and each gnuplot script runs alone on converted records. It runs every lab
# (43 s on 2 cores, the README's command at its 12 minutes without it): label long.
add_lab_test(plots_quick test_plots.py quick)
set_tests_properties(plots_quick PROPERTIES LABELS "plots;long")
# the records reader on damaged files and a diverged run: one line, status 2, nothing written
add_lab_test(plots_bad_records test_plots.py bad_records)
set_tests_properties(plots_bad_records PROPERTIES LABELS plots)
