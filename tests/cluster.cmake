# A cluster on one machine (tests/test_cluster.py): every lab's --dry-run against
# a real run of the same flags, and the per-host lines and lab06's placement
# warnings on hosts that lab06_3d/fake_hosts.c pretends (its library is built in
# lab06.cmake).
foreach(case dry_run hosts)
  add_lab_test(cluster_${case} test_cluster.py ${case})
endforeach()
if(TARGET lab06_fake_hosts)
  set_property(TEST cluster_hosts APPEND PROPERTY ENVIRONMENT "FAKE_HOSTS_LIB=$<TARGET_FILE:lab06_fake_hosts>")
endif()
