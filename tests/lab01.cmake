foreach(case equivalence determinism buckets)
  add_lab_test(lab01_${case} test_lab01.py ${case})
endforeach()
add_lab_test(gpu_lab01_cuda test_lab01.py cuda)
set_tests_properties(gpu_lab01_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
# --preset gpt2-small on the CPU: one step of one 1024-token sequence, ~40 s
add_lab_test(lab01_preset test_lab01.py preset)
set_tests_properties(lab01_preset PROPERTIES LABELS long)
