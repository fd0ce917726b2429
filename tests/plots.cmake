# plots/: the quick sweep draws every chart, gnuplot stays silent, the index names
# them, and each gnuplot script runs alone on converted records.
add_lab_test(plots_quick test_plots.py quick)
set_tests_properties(plots_quick PROPERTIES LABELS plots)
