#include "common/comm/transport/connection.h"

#include "common/check.h"

namespace syncopate {

size_t Connection::recv_some(void*, size_t, double) {
  SYN_FAIL(fmt::format("the connection to {} cannot be read partially (no recv_some)", peer()),
           "wrap the transport's own connections (tcp, memory), not a composite such as a striped one");
}

}  // namespace syncopate
