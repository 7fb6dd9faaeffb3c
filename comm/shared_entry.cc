// Anchor for the shared libraries; the code comes from the folder libraries linked in
// whole (comm/CMakeLists.txt).
extern "C" int loomSharedLibraryAnchor() {
  return 0;
}
