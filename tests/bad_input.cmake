# The bad-input matrix: the shared cases and each lab's own, one test per lab.
foreach(lab lab01_dp lab02_zero lab03_pp_naive lab04_1f1b lab05_tp lab06_3d lab07_cp)
  string(SUBSTRING ${lab} 0 5 target)
  if(TARGET ${target})
    add_lab_test(bad_input_${target} test_bad_input.py ${lab})
  endif()
endforeach()
