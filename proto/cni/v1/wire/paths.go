package wire

// Where the plugin and the daemon meet on a node, inside the run dir.
const (
	// SocketName is the daemon's CNI socket.
	SocketName = "coordino.sock"
	// DeleteQueueDir holds the DELs the plugin could not deliver.
	DeleteQueueDir = "delete-queue"
)
