foreach(case equivalence precision resume dry_run capacity_scope capacity_limits margin deepseek fine_grained)
  add_lab_test(lab08_${case} test_lab08.py ${case})
endforeach()
# every layout with every routing: ~4 x the equivalence test
add_lab_test(lab08_sweep test_lab08.py sweep)
set_tests_properties(lab08_sweep PROPERTIES LABELS long)
