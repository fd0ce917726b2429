foreach(case equivalence schedules sequence_parallel zero1 grid bad_input)
  add_lab_test(lab06_${case} test_lab06.py ${case})
endforeach()
# Several hosts, pretended on one machine: preloaded, this makes
# MPI_Get_processor_name report hosts of PL_FAKE_RANKS_PER_HOST ranks each, so
# the grid test sees the map of two hosts and the warning for a TP group that
# spans hosts.
add_library(lab06_fake_hosts SHARED ${CMAKE_CURRENT_SOURCE_DIR}/fake_hosts.c)
target_link_libraries(lab06_fake_hosts PRIVATE MPI::MPI_C)
set_property(TEST lab06_grid APPEND PROPERTY ENVIRONMENT "FAKE_HOSTS_LIB=$<TARGET_FILE:lab06_fake_hosts>")
add_lab_test(gpu_lab06_cuda test_lab06.py cuda)
set_tests_properties(gpu_lab06_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
